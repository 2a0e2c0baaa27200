"""What ends a Bridge run early: the stop file (early stop, Ctrl-C) and the trial's time limit.

``StopCheck`` is a Bridge callback (registered like ``StepRecorder``: a plain class whose
``on_<event>`` methods Bridge's ``CallbackManager.add`` picks up). Megatron-Bridge v0.6.0
(commit 51885cf132b2) ``training/train.py`` binds ``train_config = config.train`` once,
before the loop, and runs ``while train_state.step < train_config.train_iters``: the
object is bound once, its ``train_iters`` read on every pass, so setting
``cfg.train.train_iters`` on that same object (never replacing ``cfg.train``) is seen. It
fires ``on_train_step_start`` inside the loop before ``train_step`` and ``on_train_end``
only after the loop ends normally (an exit through ``should_exit`` calls ``sys.exit``
instead). So before every step the ranks agree on one flag (``agree``: an all-reduce MAX
over the world, so no rank is left waiting in the next step's collectives) and, when it is
set, the callback lowers ``cfg.train.train_iters`` to ``step + 1``: the step already begun
runs, the loop ends, ``on_train_end`` fires (memory is gathered, the FLOP count read) and
``pretrain`` returns. The runner then reports the trial ``pruned`` (stop file) or
``failed``/``time_limit`` (time limit) with the steps it has.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable, Optional

STOP_FILE, TIME_LIMIT = 1, 2  # the flag's values; the larger wins when both are seen


def _agree_max(value: int) -> int:
    """The maximum of ``value`` over every rank (Bridge's world group, gloo or nccl)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    device = torch.device("cuda", torch.cuda.current_device()) if (
        dist.get_backend() == "nccl") else torch.device("cpu")
    t = torch.tensor([value], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


class StopCheck:
    """Bridge callback: end the training loop cleanly when the stop file appears or the
    trial's ``time_limit_s`` (from ``t0``, monotonic) has passed, on every rank at once."""

    def __init__(self, *, stop_path: Optional[str], time_limit_s: float, t0: float,
                 clock: Callable[[], float] = time.monotonic,
                 agree: Callable[[int], int] = _agree_max) -> None:
        if time_limit_s <= 0:
            raise ValueError(f"StopCheck: time_limit_s must be > 0, got {time_limit_s=}")
        self.stop_path, self.time_limit_s, self.t0 = stop_path, time_limit_s, t0
        self.clock, self.agree = clock, agree
        self.reason = 0  # 0: ran to the end; STOP_FILE or TIME_LIMIT
        self.stopped_at: Optional[int] = None  # Bridge's step when the flag was agreed

    def _mine(self) -> int:
        if self.stop_path and os.path.exists(self.stop_path):
            return STOP_FILE
        if self.clock() - self.t0 > self.time_limit_s:
            return TIME_LIMIT
        return 0

    def on_train_step_start(self, context: Any) -> None:
        if self.reason:
            return  # already agreed: the loop ends after the step begun
        flag = self.agree(self._mine())
        if not flag:
            return
        state = context.state
        step = int(state.train_state.step)
        state.cfg.train.train_iters = step + 1  # this step runs; the loop ends after it
        self.reason, self.stopped_at = (TIME_LIMIT if flag >= TIME_LIMIT else STOP_FILE), step

    @property
    def stopped(self) -> bool:
        return bool(self.reason)
