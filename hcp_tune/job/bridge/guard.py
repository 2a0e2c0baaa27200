"""A drop-in Megatron-Bridge callback for production runs: stop at train start when
hierarchical context parallelism is configured but not active, and log the groups found.

::

    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain
    from hcp_tune.job.bridge.guard import HCPGuard

    pretrain(cfg, forward_step, callbacks=[HCPGuard()])

At ``on_train_start`` (Bridge v0.6.0, commit 51885cf132b2: after ``model.train()``,
before the first step) every rank reads its evidence (``bridge_verify.collect``: each TE
attention module's ``cp_comm_type``/``cp_group``, Megatron-Core's hierarchical groups),
the ranks exchange it (``all_gather_object``, so all reach the same verdict and none is
left waiting in a collective), rank 0 logs what it found, and if any rank fails every rank
raises ``HCPNotActiveError`` with the reason. Only the callback methods Bridge looks for
are defined (its ``CallbackManager.add`` registers any object's ``on_<event>`` methods), so
this module does not import Bridge and works with any Bridge >= 0.4.

Runs that do not use ``a2a+p2p`` are checked the same way for their flat CP group when CP
is on (``check_flat_cp=True``, the default), and pass through when CP is 1.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from hcp_tune.job.bridge.verify import (
    RankEvidence,
    check_cp_active,
    collect,
    describe,
    summarize_problems,
)


class HCPNotActiveError(RuntimeError):
    """Hierarchical (or flat) CP was configured, but the model's attention does not run it."""


def configured_layout(model_cfg: Any) -> Optional[tuple[str, int, int]]:
    """``(comm_type, a2a, p2p)`` as the run's model config asks for it, None without CP.

    Raises ``HCPNotActiveError`` when ``a2a+p2p`` is asked for without sizes, or with
    sizes whose product is not the CP size (the configuration itself is the failure).
    """
    cp = int(getattr(model_cfg, "context_parallel_size", 1) or 1)
    comm = getattr(model_cfg, "cp_comm_type", None) or "p2p"
    sizes = getattr(model_cfg, "hierarchical_context_parallel_sizes", None)
    if cp <= 1:
        return None
    if isinstance(comm, (list, tuple)):  # per-layer types: the guard checks uniform runs
        kinds = set(comm)
        if len(kinds) != 1:
            raise HCPNotActiveError(
                f"cp_comm_type={list(comm)} mixes types per layer; HCPGuard checks one type "
                "for all layers (remove the guard for mixed runs)")
        comm = kinds.pop()
    if comm == "a2a+p2p":
        if not sizes:
            raise HCPNotActiveError(
                f"cp_comm_type='a2a+p2p' with context_parallel_size={cp} but "
                "hierarchical_context_parallel_sizes is not set: TE would run without CP. "
                "Set model.hierarchical_context_parallel_sizes=[a2a,p2p] with a2a*p2p = cp")
        if len(sizes) != 2 or sizes[0] * sizes[1] != cp:
            raise HCPNotActiveError(
                f"hierarchical_context_parallel_sizes={list(sizes)}: expected two sizes whose "
                f"product is context_parallel_size={cp}")
        return comm, int(sizes[0]), int(sizes[1])
    if comm == "a2a":
        return comm, cp, 1
    return comm, 1, cp


def _gather_all(obj: Any) -> list:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class HCPGuard:
    """Bridge callback: fail fast when the configured CP layout is not what the model runs.

    ``expected_groups`` ({"cp"|"a2a"|"p2p": [[ranks], ...]}, e.g. from ``hcp-tune plan
    format=json``) pins the exact ranks; without it the attention modules must hold the
    groups Megatron-Core's ``parallel_state`` built, of the configured sizes. ``layout``
    (``(comm_type, a2a, p2p)``: hcp-tune's trials pass their plan) is checked instead of
    what the run's config says, so an override that changed the layout is caught too.
    ``log`` receives rank 0's report (default ``print``); ``collect_fn``, ``gather`` and
    ``rank`` are for tests.
    """

    def __init__(self, *, expected_groups: Optional[dict] = None,
                 layout: Optional[tuple[str, int, int]] = None, check_flat_cp: bool = True,
                 log: Callable[[str], None] = print,
                 collect_fn: Optional[Callable[[Any, int], RankEvidence]] = None,
                 gather: Callable[[Any], list] = _gather_all,
                 rank: Callable[[], int] = _rank) -> None:
        self.expected_groups = expected_groups or {}
        self.layout = layout
        self.check_flat_cp = check_flat_cp
        self.log = log
        self.collect_fn = collect_fn or (lambda model, r: collect(list(model), r))
        self.gather = gather
        self.rank = rank
        self.report: dict[str, Any] = {}
        # what train start checked, for the packed check after the first step (thd.ThdGuard)
        self.checked_layout: Optional[tuple[str, int, int]] = None
        self.evidence: list[RankEvidence] = []

    def on_train_start(self, context: Any) -> None:
        cfg = getattr(getattr(context, "state", None), "cfg", None)
        layout = self.layout or configured_layout(getattr(cfg, "model", None))
        if layout is not None and layout[1] * layout[2] == 1:
            layout = None  # cp = 1: nothing to prove
        if layout is None or (layout[0] != "a2a+p2p" and not self.check_flat_cp):
            self.report = {"checked": False, "reason": "no context parallelism configured"}
            return
        comm, a2a, p2p = layout
        me = self.rank()
        mine = self.collect_fn(context.model, me)
        everyone = [e if isinstance(e, RankEvidence) else RankEvidence.from_dict(e)
                    for e in self.gather(mine.as_dict())]
        problems = check_cp_active(everyone, a2a=a2a, p2p=p2p, comm_type=comm,
                                   expected=self.expected_groups)
        self.checked_layout, self.evidence = (comm, a2a, p2p), everyone
        self.report = {"checked": True, "comm_type": comm, "sizes": [a2a, p2p],
                       "problems": problems, "found": [describe(e) for e in everyone]}
        if me == 0:
            head = f"hcp-guard: cp_comm_type={comm} [a2a, p2p] = [{a2a}, {p2p}]"
            for ev in sorted(everyone, key=lambda e: e.rank):
                self.log(f"{head} | {describe(ev)}")
            self.log(f"{head}: " + ("CP active on every rank" if not problems else
                                    f"NOT ACTIVE: {summarize_problems(problems)}"))
        if problems:
            raise HCPNotActiveError(summarize_problems(problems))
