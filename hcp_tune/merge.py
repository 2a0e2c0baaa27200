"""Rank result files and their merge: the one piece of a job's output both sides read.

A trial's rank 0 writes ``result_path``; rank r > 0 writes ``<stem>.rank<r>.json`` beside it
(``rank_out_path``). When rank 0 only saw a lost peer, ``merge_root_cause`` names the first
peer that failed for its own reason. The job side writes these files, the orchestrator
merges what it reads (``engine.sweep``, ``engine.launch``, ``job.steps``): part of the
contract, so standard library and ``hcp_tune.spec`` only.
"""
from __future__ import annotations

from pathlib import Path

from hcp_tune.spec import FailureClass, Status, TrialResult, result_from_json


def rank_out_path(out: Path, rank: int) -> Path:
    return out if rank == 0 else out.with_name(f"{out.stem}.rank{rank}{out.suffix}")


def merge_root_cause(res: TrialResult, out: Path, world: int) -> TrialResult:
    """The one place a peer's root cause joins rank 0's result: when rank 0 only saw a
    lost peer (``comm``), the first other rank that failed for its own reason is named
    (``... (cause: oom: ...)``); when none did, the ranks that wrote no result (died, were
    killed or hung: see their logs). The orchestrator applies it to every result it reads,
    from either executor; applying it twice is safe."""
    if (res.status != Status.FAILED or res.failure_class != FailureClass.COMM
            or "(cause: " in (res.error or "")):
        return res
    silent = []
    for r in range(1, world):
        try:
            other = result_from_json(rank_out_path(Path(out), r).read_text())
        except OSError:
            silent.append(r)
            continue
        except ValueError:
            continue
        if other.status == Status.FAILED and other.failure_class not in (None, FailureClass.COMM):
            res.error = f"{res.error} (cause: {other.failure_class.value}: {other.error})"
            return res
    if silent:
        res.error = f"{res.error} (cause: ranks {silent} wrote no result; see their logs)"
    return res
