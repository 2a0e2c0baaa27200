"""Proof that context parallelism was active in a Bridge run, read from the model itself.

The trap (Megatron-Bridge issue #2667, hcp-facts.md section 4): with ``cp_comm_type
="a2a+p2p"`` and no hierarchical sizes, Megatron-Core's ``TEDotProductAttention`` hands TE
``get_hierarchical_context_parallel_groups(check_initialized=False)``, i.e. ``None``; TE
then runs each rank on its own chunk, with no error, at several times the real speed. A
loss comparison cannot catch it (the mock data's next token is predictable without
attention), so the proof is structural, at train start:

- every Transformer Engine attention module of the model holds the trial's
  ``cp_comm_type`` and a ``cp_group`` whose ranks are the plan's: ``[a2a group, p2p group]``
  for a2a+p2p, the flat CP group for the p2p / a2a baselines (TE's ``DotProductAttention``
  keeps ``cp_group``, ``cp_global_ranks``, ``cp_comm_type`` as attributes; Megatron-Core
  at the Megatron-LM commit Bridge v0.6.0 pins, cd4afffa648426a9,
  ``extensions/transformer_engine.py``, passes them at construction);
- the hierarchical groups exist in Megatron-Core's ``parallel_state`` with the same ranks;
- and, after the run, the achieved TFLOP/s per GPU stay under the profile's peak
  (``bench.over_peak``, shared with the attention runner).

``collect`` reads one rank's evidence (job side: torch, Megatron-Core); the rules
(``check_cp_active``) are pure functions of that recorded evidence, which
is what the tests and the production guard (``bridge.guard``) share.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

ISSUE = "the silent CP-off failure of Megatron-Bridge issue #2667"


@dataclass
class AttentionEvidence:
    name: str
    cp_comm_type: Optional[str]
    cp_groups: Optional[list[list[int]]]  # [a2a, p2p] ranks, or [flat CP ranks]; None: no group
    cp_global_ranks: Optional[list[int]] = None


@dataclass
class RankEvidence:
    rank: int
    modules: list[AttentionEvidence] = field(default_factory=list)
    hcp_state: Optional[list[list[int]]] = None  # parallel_state's hierarchical groups' ranks
    cp_state: Optional[list[int]] = None  # parallel_state's flat CP group's ranks

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RankEvidence":
        return cls(rank=d["rank"], modules=[AttentionEvidence(**m) for m in d["modules"]],
                   hcp_state=d.get("hcp_state"), cp_state=d.get("cp_state"))


def _te_attention_class() -> Optional[type]:
    try:
        import transformer_engine.pytorch as te
    except ImportError:
        return None
    return getattr(te, "DotProductAttention", None)


def collect(model_chunks: list, rank: int, *,
            is_attention: Optional[Callable[[Any], bool]] = None,
            ranks_of: Optional[Callable[[Any], list[int]]] = None,
            hcp_state: Any = "read", cp_state: Any = "read") -> RankEvidence:
    """This rank's evidence: every TE attention module's CP settings and Megatron-Core's
    CP groups. ``is_attention`` defaults to ``isinstance(m, te.pytorch.DotProductAttention)``
    (Megatron-Core's ``TEDotProductAttention`` subclasses it); ``ranks_of`` to
    ``torch.distributed.get_process_group_ranks``."""
    if ranks_of is None:
        import torch.distributed as dist

        ranks_of = dist.get_process_group_ranks
    if is_attention is None:
        te_cls = _te_attention_class()
        is_attention = (lambda m: isinstance(m, te_cls)) if te_cls else (lambda m: False)
    if hcp_state == "read" or cp_state == "read":
        from megatron.core import parallel_state as ps

        if hcp_state == "read":
            hcp_state = ps.get_hierarchical_context_parallel_groups(check_initialized=False)
        if cp_state == "read":
            cp_state = ps.get_context_parallel_group(check_initialized=False)

    def groups(g: Any) -> Optional[list[list[int]]]:
        if g is None:
            return None
        if isinstance(g, (list, tuple)):
            return [list(ranks_of(x)) if x is not None else [] for x in g]
        return [list(ranks_of(g))]

    ev = RankEvidence(rank=rank, hcp_state=groups(hcp_state),
                      cp_state=groups(cp_state)[0] if cp_state is not None else None)
    for i, chunk in enumerate(model_chunks):
        for name, module in chunk.named_modules():
            if is_attention(module):
                ev.modules.append(AttentionEvidence(
                    name=f"chunk{i}.{name}", cp_comm_type=getattr(module, "cp_comm_type", None),
                    cp_groups=groups(getattr(module, "cp_group", None)),
                    cp_global_ranks=(list(getattr(module, "cp_global_ranks", None) or []) or None)))
    return ev


def _containing(groups: Optional[list[list[int]]], rank: int) -> Optional[list[int]]:
    for g in groups or []:
        if rank in g:
            return sorted(g)
    return None


def _expected_for(rank: int, a2a: int, p2p: int, expected: dict, ev: RankEvidence) -> dict:
    """The groups this rank must be in: the plan's, or (no plan: the production guard)
    Megatron-Core's own state, whose sizes are checked."""
    if expected:
        return {k: _containing(expected.get(k), rank) for k in ("cp", "a2a", "p2p")}
    hcp = ev.hcp_state or [None, None]
    return {"cp": sorted(ev.cp_state) if ev.cp_state else None,
            "a2a": sorted(hcp[0]) if hcp[0] else None, "p2p": sorted(hcp[1]) if hcp[1] else None}


def check_rank(ev: RankEvidence, *, a2a: int, p2p: int, comm_type: str,
               expected: Optional[dict] = None) -> list[str]:
    """Problems on one rank (empty: CP is active there as planned)."""
    r, problems = ev.rank, []
    want = _expected_for(r, a2a, p2p, expected or {}, ev)
    hier = comm_type == "a2a+p2p"
    if hier:
        if not ev.hcp_state:
            problems.append(f"rank {r}: Megatron-Core's parallel_state has no hierarchical CP "
                            "groups (hierarchical_context_parallel_sizes never reached it): "
                            f"{ISSUE}")
        else:
            got = [sorted(g) for g in ev.hcp_state]
            sizes = [len(g) for g in got]
            if sizes != [a2a, p2p]:
                problems.append(f"rank {r}: parallel_state's hierarchical groups have sizes "
                                f"{sizes}, expected [a2a, p2p] = [{a2a}, {p2p}]")
            elif expected and got != [want["a2a"], want["p2p"]]:
                problems.append(f"rank {r}: parallel_state's hierarchical groups {got} differ "
                                f"from the plan's [{want['a2a']}, {want['p2p']}]")
    if not ev.modules:
        problems.append(f"rank {r}: no Transformer Engine attention module in the model "
                        "(transformer_impl must be 'transformer_engine'): CP cannot be proven")
    for m in ev.modules:
        if m.cp_comm_type != comm_type:
            problems.append(f"rank {r}: {m.name} has cp_comm_type={m.cp_comm_type!r}, "
                            f"expected {comm_type!r}")
            continue
        if not m.cp_groups or not any(m.cp_groups):
            problems.append(f"rank {r}: {m.name} holds no CP group (cp_group=None): TE runs "
                            f"it on this rank's chunk only, {ISSUE}")
            continue
        got = [sorted(g) for g in m.cp_groups]
        if hier:
            target = [want["a2a"], want["p2p"]]
            if len(got) != 2:
                problems.append(f"rank {r}: {m.name} holds {len(got)} CP group(s), expected "
                                "two levels [a2a group, p2p group]")
            elif [len(g) for g in got] != [a2a, p2p]:
                problems.append(f"rank {r}: {m.name}'s CP groups have sizes "
                                f"{[len(g) for g in got]}, expected [{a2a}, {p2p}]")
            elif None not in target and got != target:
                problems.append(f"rank {r}: {m.name}'s CP groups {got} differ from the "
                                f"{'plan' if expected else 'parallel_state'}'s {target}")
        else:
            if len(got) != 1 or len(got[0]) != a2a * p2p:
                problems.append(f"rank {r}: {m.name}'s CP group {got} is not one group of "
                                f"cp = {a2a * p2p} ranks")
            elif want["cp"] is not None and got[0] != want["cp"]:
                problems.append(f"rank {r}: {m.name}'s CP group {got[0]} differs from the "
                                f"{'plan' if expected else 'parallel_state'}'s {want['cp']}")
        if m.cp_global_ranks and want["cp"] is not None and sorted(m.cp_global_ranks) != want["cp"]:
            problems.append(f"rank {r}: {m.name}'s cp_global_ranks {sorted(m.cp_global_ranks)} "
                            f"differ from the CP group {want['cp']}")
    return problems


def check_cp_active(evidence: list[RankEvidence], *, a2a: int, p2p: int, comm_type: str,
                    expected: Optional[dict] = None, world_size: Optional[int] = None
                    ) -> list[str]:
    """Problems over every rank's evidence; empty means CP was active as planned."""
    problems = []
    if world_size is not None and len(evidence) != world_size:
        problems.append(f"evidence from {len(evidence)} of {world_size} ranks")
    for ev in sorted(evidence, key=lambda e: e.rank):
        problems += check_rank(ev, a2a=a2a, p2p=p2p, comm_type=comm_type, expected=expected)
    return problems


def summarize_problems(problems: list[str]) -> str:
    """One line for a result's ``error``: the first problem and how many more."""
    if not problems:
        return ""
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return problems[0] + more


def describe(ev: RankEvidence) -> str:
    """What one rank found, for the log: its groups and how many modules hold them."""
    counts: dict[tuple[Optional[str], str], int] = {}
    for m in ev.modules:
        key = (m.cp_comm_type, str(m.cp_groups))
        counts[key] = counts.get(key, 0) + 1
    held = "; ".join(f"{n} module(s) cp_comm_type={c} cp_group={g}"
                     for (c, g), n in sorted(counts.items(), key=str)) or "no TE attention modules"
    return (f"rank {ev.rank}: parallel_state CP group {ev.cp_state}, hierarchical groups "
            f"{ev.hcp_state}; {held}")
