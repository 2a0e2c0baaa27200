"""Whether this machine's SLURM can run a sweep, asked once of ``sinfo`` before anything is
submitted or written.

A login node often has SLURM's client installed (``sbatch`` on PATH) while the controller
does not answer it (down, firewalled, another cluster's config). ``sbatch`` on PATH says
only that the client is there; ``sinfo`` failing says that nothing can be submitted. The
sweep command reads ``unreachable``: ``runner=auto`` then predicts and says why in one
line; an asked-for SLURM executor stops with one line (``SlurmUnreachable``, its own exit
code) before ``results/jobs/`` is touched. ``cannot_host`` answers the next question: the
controller answers, but has it the nodes and GPUs the smallest trial needs?
"""
from __future__ import annotations

import math
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Optional

from hcp_tune.errors import EXIT_UNREACHABLE, HcpError, one_line

SINFO = ["sinfo", "-h", "-o", "%P|%D|%G"]
TIMEOUT_S = 20.0


class SlurmUnreachable(HcpError):
    """SLURM was asked for (``executor=slurm``) but its controller does not answer."""

    exit_code = EXIT_UNREACHABLE


@dataclass(frozen=True)
class Answer:
    """``sinfo``'s partition lines, or why there are none (``error``, one line)."""

    text: str = ""
    error: str = ""


def ask() -> Answer:
    """Run ``sinfo -h -o '%P|%D|%G'`` once; its failure as one line naming the command."""
    command = " ".join(SINFO[:2])
    if not shutil.which(SINFO[0]):
        return Answer(error=f"`{command}`: sinfo is not on PATH")
    try:
        out = subprocess.run(SINFO, capture_output=True, text=True, timeout=TIMEOUT_S,
                             check=False)
    except subprocess.TimeoutExpired:
        return Answer(error=f"`{command}` did not answer in {TIMEOUT_S:.0f} s")
    except (OSError, subprocess.SubprocessError) as err:
        return Answer(error=f"`{command}` could not run: {one_line(err)}")
    if out.returncode != 0:
        said = one_line(out.stderr or out.stdout) or "no message"
        return Answer(error=f"`{command}` failed (exit {out.returncode}): {said[:240]}")
    return Answer(text=out.stdout)


def refuse(answer: Answer, executor: str) -> SlurmUnreachable:
    """The one line for an asked-for SLURM executor whose controller did not answer."""
    return SlurmUnreachable(
        f"executor={executor}: SLURM does not answer here: {answer.error}; nothing was "
        "submitted. Check the controller (`scontrol ping`), run on a node that reaches it, "
        "or use executor=local (this machine) or runner=model (predict only)")


_GRES_GPUS = re.compile(r"gpu(?::[^:,()]+)?:(\d+)")


def partition_nodes(sinfo_text: str, partition: Optional[str], gpus: int) -> int:
    """Nodes of ``partition`` (the default one, marked ``*``, when None) with at least
    ``gpus`` GPUs in their gres, from ``sinfo -h -o '%P|%D|%G'`` lines (fields after the
    third are ignored)."""
    total = 0
    for line in sinfo_text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or not parts[1].isdigit():
            continue
        name, nodes, gres = parts[:3]
        if name.rstrip("*") != partition if partition else not name.endswith("*"):
            continue
        have = max((int(n) for n in _GRES_GPUS.findall(gres)), default=0)
        total += int(nodes) if have >= gpus else 0
    return total


def cannot_host(cfg: Any, answer: Optional[Answer] = None) -> str:
    """Why this machine's SLURM cannot run the sweep's smallest trial ('' when it can, or
    when that cannot be told): a GPU profile's trial of tp*cp*dp ranks (the smallest tp)
    needs ceil(ranks / gpus_per_node) nodes with that many GPUs each in the partition.
    ``runner=auto`` then predicts instead of submitting jobs SLURM would never start.
    ``answer``: sinfo's, when the caller asked already."""
    gpus_per_node = cfg.executor.gpus_per_node
    if gpus_per_node is None:
        gpus_per_node = cfg.cluster.gpus_per_node
    if cfg.cluster.device != "cuda" or gpus_per_node < 1:
        return ""
    answer = answer or ask()
    if answer.error:
        return ""
    ranks = min(cfg.tps or (1,)) * cfg.cp * cfg.dp
    per_node = min(gpus_per_node, ranks)
    need = math.ceil(ranks / gpus_per_node)
    have = partition_nodes(answer.text, cfg.executor.partition, per_node)
    if have >= need:
        return ""
    where = f"partition {cfg.executor.partition}" if cfg.executor.partition else \
        "the default partition"
    return (f"SLURM here has {have} node(s) with {per_node} GPU(s) in {where}; the smallest "
            f"trial of cluster={cfg.cluster.name} needs {ranks} ranks on {need} node(s) of "
            f"{gpus_per_node} GPUs")
