"""Megatron-Core's context-parallel groups for one trial: create them with the real
``parallel_state.initialize_model_parallel``, read them back, compare them with the plan's
expected ranks (``TrialSpec.expected_groups``), and destroy them between trials.

On CPU this runs on gloo: ``initialize_model_parallel`` only touches CUDA in its SHARP
branches (``use_sharp``/``sharp_enabled_group``, left off here). We pass
``create_gloo_process_groups=False``: the trial needs no extra gloo copies of the
data-parallel groups, and fewer groups start faster.

Teardown: ``destroy_model_parallel`` only forgets Megatron-Core's groups (0.16.1 and
0.19.2 alike set every ``_..._GROUP`` global and ``_global_process_group_list`` to None and
destroy only the gloo copies); the NCCL or gloo groups themselves stay registered with
torch.distributed, holding communicators, sockets and buffers. In both versions every
group is made by ``parallel_state.create_group`` -> ``torch.distributed.new_group``, so
the groups a trial made are exactly those torch's registry gained between before
``init_groups`` and now; ``destroy_groups`` destroys each of them, newest first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch.distributed as dist

from hcp_tune.job.mcore import parallel_state


@dataclass
class CPGroups:
    """This rank's groups, as Megatron-Core built them."""

    cp: Any  # the flat CP process group
    cp_ranks: list[int]
    a2a: Any  # HCP level 0; None when the HCP groups were never created
    p2p: Any  # HCP level 1
    a2a_ranks: Optional[list[int]]
    p2p_ranks: Optional[list[int]]
    tp_rank: int
    cp_rank: int  # position in the flat CP group: holds chunks cp_rank and 2cp-1-cp_rank

    @property
    def hierarchical(self) -> bool:
        return self.a2a is not None and self.p2p is not None


def _clear_stale_hcp_groups() -> bool:
    """Forget HCP groups left by an earlier trial in this process; True if there were some.

    Megatron-Core 0.16.1's ``destroy_model_parallel`` resets the flat CP group but not
    ``_HIERARCHICAL_CONTEXT_PARALLEL_GROUPS``: a later trial that never asks for HCP groups
    would silently find the previous trial's, and its group check would pass on stale
    groups. We reset that one module global ourselves, here and nowhere else.
    """
    ps = parallel_state()

    stale = ps.get_hierarchical_context_parallel_groups(check_initialized=False) is not None
    if stale:
        ps._HIERARCHICAL_CONTEXT_PARALLEL_GROUPS = None
    return stale


def registered_groups() -> list[Any]:
    """Every process group torch.distributed knows in this process, oldest first (the world
    group too). ``_world.pg_map`` is private, but it is the registry itself, and
    Megatron-Core 0.19's own ``destroy_model_parallel`` reads it the same way."""
    from torch.distributed import distributed_c10d as c10d

    return list(c10d._world.pg_map)


def init_groups(*, tp: int, a2a: int, p2p: int, timeout_s: float, hierarchical: bool = True
                ) -> frozenset:
    """Build the groups; ``hierarchical=False`` plants the silent failure (sizes never given).

    The HCP sizes are passed for the p2p/a2a baselines too ([1, cp] or [cp, 1]): the level
    groups then mirror the flat CP group, and every layout's groups can be checked alike.
    Returns the groups that existed before, for ``destroy_groups``.
    """
    ps = parallel_state()

    cp = a2a * p2p
    _clear_stale_hcp_groups()
    before = frozenset(registered_groups())
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp,
        context_parallel_size=cp,
        hierarchical_context_parallel_sizes=[a2a, p2p] if hierarchical and cp > 1 else None,
        distributed_timeout_minutes=timeout_s / 60.0,  # a timedelta(minutes=...) inside
        create_gloo_process_groups=False,
    )
    return before


def read_groups() -> CPGroups:
    ps = parallel_state()

    cp_group = ps.get_context_parallel_group()
    hcp = ps.get_hierarchical_context_parallel_groups(check_initialized=False)
    a2a, p2p = (hcp[0], hcp[1]) if hcp else (None, None)
    return CPGroups(
        cp=cp_group,
        cp_ranks=list(dist.get_process_group_ranks(cp_group)),
        a2a=a2a,
        p2p=p2p,
        a2a_ranks=list(dist.get_process_group_ranks(a2a)) if a2a is not None else None,
        p2p_ranks=list(dist.get_process_group_ranks(p2p)) if p2p is not None else None,
        tp_rank=ps.get_tensor_model_parallel_rank(),
        cp_rank=ps.get_context_parallel_rank(),
    )


def destroy_groups(before: frozenset, *, destroy_communicators: bool = True) -> int:
    """Forget Megatron-Core's groups and destroy every group made since ``before``.

    Collective in spirit: every rank calls it after the same last collective. With
    ``destroy_communicators=False`` (after a failed trial, when a peer may be gone and a
    communicator's shutdown could wait on it) only Megatron-Core's globals are reset; the
    process ends soon after. Returns how many groups were destroyed.
    """
    import torch.distributed as dist
    ps = parallel_state()

    ps.destroy_model_parallel()
    _clear_stale_hcp_groups()  # not reset by destroy_model_parallel (see above)
    if not destroy_communicators:
        return 0
    made = [g for g in registered_groups() if g not in before]
    for group in reversed(made):  # newest first, as torch shuts the world's groups down
        dist.destroy_process_group(group)
    return len(made)


def _canon(groups) -> list[tuple[int, ...]]:
    return sorted({tuple(sorted(g)) for g in groups})


def compare_groups(
    actual: dict[str, list], expected: dict[str, list[list[int]]], *, a2a: int, p2p: int
) -> list[str]:
    """Problems found comparing the union of every rank's groups with the plan (empty: match).

    ``actual[kind]`` holds one entry per rank (its group's ranks, or None when missing).
    """
    problems = []
    for kind, size in (("cp", a2a * p2p), ("a2a", a2a), ("p2p", p2p)):
        if kind != "cp" and a2a * p2p == 1:
            continue  # cp=1 runs no CP at all: Megatron-Core builds no HCP levels for it
        seen = actual[kind]
        if any(g is None for g in seen):
            missing = [r for r, g in enumerate(seen) if g is None]
            problems.append(
                f"{kind} groups missing on ranks {missing}: the HCP groups were never created "
                "(hierarchical_context_parallel_sizes not given), so TE would run without CP"
            )
            continue
        got = _canon(seen)
        bad_size = [g for g in got if len(g) != size]
        if bad_size:
            problems.append(f"{kind} groups {bad_size} do not have size {size}")
        if expected.get(kind) is not None:
            want = _canon(expected[kind])
            if got != want:
                problems.append(f"{kind} groups differ: expected {want}, got {got}")
    return problems


def check_groups(groups: CPGroups, spec) -> dict[str, Any]:
    """Collective: rank 0 compares everyone's groups with the plan; all ranks get the verdict."""
    mine = {"cp": groups.cp_ranks, "a2a": groups.a2a_ranks, "p2p": groups.p2p_ranks}
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    actual = {k: [g[k] for g in gathered] for k in ("cp", "a2a", "p2p")}
    verdict = [None]
    if dist.get_rank() == 0:
        problems = compare_groups(actual, spec.expected_groups, a2a=spec.a2a, p2p=spec.p2p)
        verdict[0] = {
            "match": not problems,
            "problems": problems,
            "expected": spec.expected_groups or "not given (sizes checked only)",
            "actual": {
                k: [list(g) for g in _canon(v)] if all(x is not None for x in v) else None
                for k, v in actual.items()
            },
        }
    dist.broadcast_object_list(verdict, src=0)
    return verdict[0]
