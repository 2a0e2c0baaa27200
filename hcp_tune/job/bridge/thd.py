"""Proof that a packed Bridge trial ran THD attention with CP on every attention module.

``guard.HCPGuard`` proves at train start that the modules hold the planned CP groups; a
packed trial must also prove that its documents reached attention as THD, which only a
forward shows. So ``ThdProbe`` puts a forward pre-hook (``with_kwargs=True``) on every TE
attention module and records the first call's ``packed_seq_params``: Megatron-Core's
attention passes it by keyword to ``TEDotProductAttention.forward`` (Megatron-LM cd4afffa,
``transformer/attention.py`` and ``extensions/transformer_engine.py``), whose
``qkv_format`` is ``"thd"`` when Bridge built it from the batch's cu_seqlens
(``utils/packed_seq_utils.get_packed_seq_params``). The hook also reads the CP group that
forward will run: ``packed_seq_params.cp_group`` when set (the forward then resets the
module's group to it), else the module's own; ``local_cp_size`` without a group turns CP
off in that forward. ``ThdGuard`` (a Bridge callback, after the step recorder so its
collective is in no timed step) checks every rank's records at the end of the first step
(``check_thd``, pure) and fails the trial as invalid when a module ran without THD or
without the planned CP groups.

``pad_between_seqs``: Bridge v0.6.0 never sets it (``get_packed_seq_params``), so TE
auto-detects it: TE <= 2.17.1 compares the offsets (and reads a tail-padded last sequence
as unpadded: silently wrong attention, TE #3331), TE >= 2.18 tests ``cu_seqlens_q_padded is
cu_seqlens_q`` (TE #2898; Bridge's tensors are distinct, so True). The probe hands TE
``pad_between_seqs=True`` where Megatron-Core's ``PackedSeqParams`` has the field and it is
unset: the same as TE >= 2.18 decides for Bridge's batches, and correct on older TE; the
records say it was set here.
"""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Callable, Optional

from hcp_tune.job.bridge.verify import AttentionEvidence, RankEvidence, check_rank


def _ranks(group: Any, ranks_of: Callable[[Any], list[int]]) -> Optional[list[list[int]]]:
    if group is None:
        return None
    if isinstance(group, (list, tuple)):
        return [list(ranks_of(g)) if g is not None else [] for g in group]
    return [list(ranks_of(group))]


class ThdProbe:
    """Forward pre-hooks on the attention modules: the first forward's packed params."""

    def __init__(self, *, is_attention: Callable[[Any], bool],
                 ranks_of: Optional[Callable[[Any], list[int]]] = None,
                 fill_pad_between_seqs: bool = True) -> None:
        self.is_attention, self.fill = is_attention, fill_pad_between_seqs
        self.ranks_of = ranks_of
        self.seen: dict[str, dict[str, Any]] = {}
        self.handles: list = []

    def attach(self, model_chunks: list) -> int:
        """Hooks on every attention module of the chunks; how many."""
        if self.ranks_of is None:
            import torch.distributed as dist

            self.ranks_of = dist.get_process_group_ranks
        for i, chunk in enumerate(model_chunks):
            for name, module in chunk.named_modules():
                if self.is_attention(module):
                    self.handles.append(module.register_forward_pre_hook(
                        partial(self._hook, f"chunk{i}.{name}"), with_kwargs=True))
        return len(self.handles)

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def _hook(self, name: str, module: Any, args: tuple, kwargs: dict):
        p = kwargs.get("packed_seq_params")
        set_here = False
        if (p is not None and self.fill and dataclasses.is_dataclass(p)
                and "pad_between_seqs" in {f.name for f in dataclasses.fields(p)}
                and p.pad_between_seqs is None):
            p = dataclasses.replace(p, pad_between_seqs=True)
            kwargs = {**kwargs, "packed_seq_params": p}
            set_here = True
        if name not in self.seen:
            self.seen[name] = self._record(name, module, p, set_here)
        return (args, kwargs) if set_here else None

    def _record(self, name: str, module: Any, p: Any, set_here: bool) -> dict[str, Any]:
        group = getattr(p, "cp_group", None) if p is not None else None
        cp_off = p is not None and group is None and getattr(p, "local_cp_size", None) == 1
        if group is None and not cp_off:
            group = getattr(module, "cp_group", None)
        cu, cu_pad = getattr(p, "cu_seqlens_q", None), getattr(p, "cu_seqlens_q_padded", None)
        return {
            "name": name, "packed": p is not None, "qkv_format": getattr(p, "qkv_format", None),
            "documents": int(cu.numel()) - 1 if cu is not None else None,
            "padded_is_unpadded": (cu_pad is None or cu_pad is cu) if p is not None else None,
            "pad_between_seqs": getattr(p, "pad_between_seqs", None),
            "pad_between_seqs_set_here": set_here, "cp_off": cp_off,
            "cp_comm_type": getattr(module, "cp_comm_type", None),
            "cp_groups": None if cp_off else _ranks(group, self.ranks_of),
            "cp_global_ranks": list(getattr(module, "cp_global_ranks", None) or []) or None}

    def evidence(self, rank: int) -> dict[str, Any]:
        return {"rank": rank, "modules": [self.seen[k] for k in sorted(self.seen)]}


def check_thd(evidence: list[dict[str, Any]], start: list[RankEvidence],
              layout: Optional[tuple[str, int, int]], expected: Optional[dict] = None
              ) -> list[str]:
    """Problems with THD or CP in the first step's forwards (empty: both active as planned).
    ``start``: each rank's train-start evidence (its ``parallel_state`` groups);
    ``layout``: ``(comm_type, a2a, p2p)`` as the CP guard checked it, None without CP."""
    problems = []
    at_start = {e.rank: e for e in start}
    for ev in sorted(evidence, key=lambda e: e["rank"]):
        r, mods = ev["rank"], ev["modules"]
        if not mods:
            problems.append(f"rank {r}: no attention forward was recorded in the first step: "
                            "THD cannot be proven")
        for m in mods:
            if not m["packed"]:
                problems.append(f"rank {r}: {m['name']} ran without packed_seq_params: the "
                                "batch's cu_seqlens did not reach attention (one document a "
                                "sequence, sbhd)")
            elif m["qkv_format"] != "thd":
                problems.append(f"rank {r}: {m['name']} got qkv_format={m['qkv_format']!r}, "
                                "expected 'thd'")
            if m["cp_off"]:
                problems.append(f"rank {r}: {m['name']}: packed_seq_params turned CP off in "
                                "forward (local_cp_size=1 and no cp_group)")
        base = at_start.get(r)
        seen = RankEvidence(rank=r, modules=[AttentionEvidence(
            name=f"{m['name']} (in forward)", cp_comm_type=m["cp_comm_type"],
            cp_groups=m["cp_groups"], cp_global_ranks=m["cp_global_ranks"])
            for m in mods if not m["cp_off"]],
            hcp_state=base.hcp_state if base else None, cp_state=base.cp_state if base else None)
        if layout is not None and seen.modules:  # the groups forward runs, as train start's
            comm_type, a2a, p2p = layout
            problems += check_rank(seen, a2a=a2a, p2p=p2p, comm_type=comm_type,
                                   expected=expected)
    return problems


def summary(evidence: list[dict[str, Any]]) -> dict[str, Any]:
    """What the first step's forwards showed, for the trial's record and fingerprint."""
    mods = [m for ev in evidence for m in ev["modules"]]

    def values(key: str) -> list:
        return sorted({str(m[key]) for m in mods})

    return {"modules": len(mods), "qkv_format": values("qkv_format"),
            "documents": values("documents"), "pad_between_seqs": values("pad_between_seqs"),
            "pad_between_seqs_set_here": any(m["pad_between_seqs_set_here"] for m in mods),
            "padded_is_unpadded": values("padded_is_unpadded")}


class ThdGuard:
    """Bridge callback: hooks at train start, the THD + CP check at the first step's end."""

    def __init__(self, guard: Any, probe: ThdProbe, *, log: Callable[[str], None] = print,
                 gather: Optional[Callable[[Any], list]] = None,
                 rank: Optional[Callable[[], int]] = None) -> None:
        from hcp_tune.job.bridge.guard import _gather_all, _rank

        self.guard, self.probe, self.log = guard, probe, log
        self.gather, self.rank = gather or _gather_all, rank or _rank
        self.report: dict[str, Any] = {"checked": False, "reason": "no training step ended"}

    def on_train_start(self, context: Any) -> None:
        self.probe.attach(list(context.model))

    def on_train_step_end(self, context: Any) -> None:
        from hcp_tune.job.bridge.guard import HCPNotActiveError
        from hcp_tune.job.bridge.verify import summarize_problems

        if self.report["checked"]:
            return
        everyone = self.gather(self.probe.evidence(self.rank()))
        problems = check_thd(everyone, self.guard.evidence, self.guard.checked_layout,
                             self.guard.expected_groups)
        self.report = {"checked": True, "problems": problems, **summary(everyone)}
        if self.rank() == 0:
            self.log(f"hcp-guard: packed (THD) | {self.report}")
        if problems:
            raise HCPNotActiveError(summarize_problems(problems))
