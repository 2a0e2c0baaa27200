"""Where a trial's ranks ran and how NCCL connected them. Standard library only (job side).

The plan assumes block placement: with T tasks per node, global rank r sits on node r // T,
so an a2a group of tp*a consecutive ranks stays on one node when tp*a <= T (hcp-facts.md
section 2). A cyclic distribution (``srun --distribution=cyclic``, or a site default) puts
consecutive ranks on different nodes: the all-to-all level then runs over the inter-node
network while the plan, and the ranking, believe it is on NVLink. Nothing fails; it is
just slower, and the layout ranking is of another machine. So every trial checks:

- ``rank_nodes``: each rank's node as an index in order of first appearance (kept in the
  fingerprint: host-name free, so two runs with the same placement agree, and a change of
  placement shows as drift);
- ``placement_problems``: every planned a2a group that block placement keeps on one node
  must be on one host; one that spans hosts fails the trial (``PlacementError``) with the
  groups, the hosts and the fix (``--distribution=block``);
- ``transports``: the NCCL transports rank 0's channels use (``P2P/...``, ``SHM/...``,
  ``NET/IB``...), read from NCCL's own INFO log (``Channel 00/0 : 0[0] -> 1[1] via P2P/IPC``)
  that ``nccl_log_env`` asks NCCL to write to a file when the user set no ``NCCL_DEBUG``.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from hcp_tune.job.failures import EnvironmentProblem

FIX = ("ranks must fill one node after another (srun --distribution=block), or the "
       "all-to-all crosses nodes")


class PlacementError(EnvironmentProblem):
    """A planned intra-node group was placed across hosts."""


def rank_nodes(hosts: list[str]) -> list[int]:
    """Each rank's node as an index in order of first appearance: ``[0, 0, 1, 1]``."""
    order: dict[str, int] = {}
    return [order.setdefault(h, len(order)) for h in hosts]


def placement_problems(expected_groups: dict, hosts: list[str]) -> list[str]:
    """Every a2a group of the plan that block placement keeps on one node and the real
    placement spreads over several hosts; ``hosts[r]`` is rank r's host."""
    if not hosts or not expected_groups.get("a2a"):
        return []
    per_node = max(hosts.count(h) for h in set(hosts))  # tasks per node, whatever the order
    out = []
    for group in expected_groups["a2a"]:
        if len({r // per_node for r in group}) != 1 or max(group) >= len(hosts):
            continue  # the plan itself crosses nodes here: not a placement problem
        spread = sorted({hosts[r] for r in group})
        if len(spread) > 1:
            out.append(f"a2a group {list(group)} is planned on one node ({per_node} tasks per "
                       f"node, block order) but ran on {len(spread)} hosts: {', '.join(spread)}")
    return out


def check(expected_groups: dict, hosts: list[str]) -> None:
    """Raise ``PlacementError`` naming the first group placed across hosts, and the fix."""
    problems = placement_problems(expected_groups, hosts)
    if problems:
        more = f" (and {len(problems) - 1} more group(s))" if len(problems) > 1 else ""
        raise PlacementError(f"rank placement: {FIX}: {problems[0]}{more}")


def is_block(hosts: list[str]) -> bool:
    """Whether ranks fill one node after another (each host's ranks consecutive)."""
    nodes = rank_nodes(hosts)
    return nodes == sorted(nodes)


def nccl_log_env(path: Path, environ) -> dict[str, str]:
    """What to export so NCCL writes its channel set-up to ``path``: nothing when the user
    set ``NCCL_DEBUG`` (their logging stays as they chose it). INIT only: lines at
    communicator creation, none during the timed steps."""
    if "NCCL_DEBUG" in environ:
        return {}
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT", "NCCL_DEBUG_FILE": str(path)}


_CHANNEL = re.compile(r"Channel \d+/\d+ : .*? via (\S+)")


def transports(text: str) -> list[str]:
    """The transports of NCCL's channel lines, as ``KIND/MECHANISM``: ``P2P/IPC``,
    ``SHM/direct``, ``NET/IB``, sorted and without repeats."""
    found = set()
    for via in _CHANNEL.findall(text):
        parts = via.split("/")
        found.add("/".join(parts[:2]))
    return sorted(found)


def read_transports(path: Optional[Path]) -> Optional[list[str]]:
    """``transports`` of the file NCCL wrote, or None when there is none to read."""
    if path is None or not path.is_file():
        return None
    return transports(path.read_text(errors="replace")) or None
