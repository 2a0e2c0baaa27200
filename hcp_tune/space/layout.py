"""The layout space: every ``[a2a, p2p]`` split of CP, kept or rejected by the HCP rules
(``rules.py``, the one home of each rule), and the rank groups Megatron-Core builds for each
split, with their placement on nodes.

Pure functions over numbers: no torch, no files. The group formula follows
``parallel_state.initialize_model_parallel`` (order tp-cp-ep-dp-pp; inside each flat CP
group, level 0 (a2a) takes contiguous positions and level 1 (p2p) takes stride ``a2a``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hcp_tune.config.cluster import ClusterProfile
from hcp_tune.config.model import ModelSpec
from hcp_tune.spec import comm_type_of
from hcp_tune.upstream.rules import LAYOUT_RULES, Facts, Finding, evaluate

CommType = Literal["none", "p2p", "a2a", "a2a+p2p"]
Groups = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class Layout:
    """``[a2a, p2p]`` with ``a2a * p2p == cp``; the endpoints run as plain p2p / a2a."""

    a2a: int
    p2p: int

    @property
    def cp(self) -> int:
        return self.a2a * self.p2p

    @property
    def sizes(self) -> list[int]:
        return [self.a2a, self.p2p]

    @property
    def comm_type(self) -> CommType:
        return comm_type_of(self.a2a, self.p2p)  # type: ignore[return-value]

    @property
    def label(self) -> str:
        return f"[{self.a2a},{self.p2p}]"

    def bridge_overrides(self) -> list[str]:
        """Paste-ready Bridge CLI overrides that run this layout."""
        out = [f"model.context_parallel_size={self.cp}"]
        if self.comm_type == "none":
            return out
        out.append(f"model.cp_comm_type={self.comm_type}")
        if self.comm_type == "a2a+p2p":
            out.append(f'"model.hierarchical_context_parallel_sizes={self.label}"')
        return out


def factorizations(cp: int) -> list[Layout]:
    """Every ordered two-level split of ``cp``, from pure ring ``[1,cp]`` to pure a2a."""
    return [Layout(a, cp // a) for a in range(1, cp + 1) if cp % a == 0]


@dataclass(frozen=True)
class RankGroups:
    """Global ranks of every CP group and of both HCP levels, and where they sit."""

    cp: Groups
    a2a: Groups  # level 0: contiguous positions inside each CP group
    p2p: Groups  # level 1: stride-a2a positions inside each CP group
    world_size: int
    gpus_per_node: int

    @property
    def nodes(self) -> int:
        return -(-self.world_size // self.gpus_per_node)

    def _crosses(self, groups: Groups) -> bool:
        return any(len({r // self.gpus_per_node for r in g}) > 1 for g in groups)

    @property
    def a2a_crosses_nodes(self) -> bool:
        return self._crosses(self.a2a)

    @property
    def a2a_members_per_node(self) -> int:
        """The fewest members of one a2a group that share a node: a rank of that node has
        ``this - 1`` all-to-all peers on its own node and the rest on others (the group's
        size when no group crosses nodes)."""
        counts = []
        for g in self.a2a:
            nodes = [r // self.gpus_per_node for r in g]
            counts += [nodes.count(n) for n in set(nodes)]
        return min(counts)

    @property
    def p2p_crosses_nodes(self) -> bool:
        return self._crosses(self.p2p)

    def as_dict(self) -> dict[str, list[list[int]]]:
        return {k: [list(g) for g in getattr(self, k)] for k in ("cp", "a2a", "p2p")}


def rank_groups(layout: Layout, *, tp: int, dp: int = 1, pp: int = 1,
                gpus_per_node: int) -> RankGroups:
    """The groups Megatron-Core creates for ``layout`` (ep=1, order tp-cp-ep-dp-pp, the
    default of ``initialize_model_parallel`` in Megatron-Core 0.16 and 0.19).

    Global rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)): PP varies
    slowest, so pipeline stage ``s`` holds the ``tp*cp*dp`` consecutive ranks from
    ``s*tp*cp*dp`` and has CP groups of its own. A flat CP group fixes tp_rank, dp_rank and
    pp_rank. Level-0 groups are consecutive runs of ``a2a`` members of it, level-1 groups
    take every ``a2a``-th member.
    """
    cp, a = layout.cp, layout.a2a
    cp_groups, l0, l1 = [], [], []
    for s in range(pp):
        for d in range(dp):
            for t in range(tp):
                members = [t + tp * (j + cp * (d + dp * s)) for j in range(cp)]
                cp_groups.append(tuple(members))
                l0 += [tuple(members[k * a : (k + 1) * a]) for k in range(layout.p2p)]
                l1 += [tuple(members[i::a]) for i in range(a)]
    return RankGroups(tuple(cp_groups), tuple(l0), tuple(l1), tp * cp * dp * pp,
                      gpus_per_node)


@dataclass(frozen=True)
class Candidate:
    """One layout for one (tp, cp, seq): kept or rejected, with reasons a user can act on."""

    layout: Layout
    tp: int
    seq: int
    dp: int
    kept: bool
    reasons: tuple[str, ...] = ()  # why it is rejected (empty when kept)
    flags: tuple[str, ...] = ()  # kept, but worth knowing (e.g. a2a over inter-node links)
    groups: RankGroups | None = field(default=None, compare=False)
    findings: tuple[Finding, ...] = field(default=(), compare=False)  # the rules that fired
    pp: int = 1  # pipeline stages: the world is tp*cp*dp*pp, each stage has its own CP groups

    @property
    def cp(self) -> int:
        return self.layout.cp

    def stage_groups(self, gpus_per_node: int) -> RankGroups:
        """The groups of pipeline stage 0 alone (world tp*cp*dp): what the attention runner
        builds and checks, since it measures one stage's CP groups, not the pipeline."""
        return rank_groups(self.layout, tp=self.tp, dp=self.dp, gpus_per_node=gpus_per_node)


def layout_facts(model: ModelSpec, cluster: ClusterProfile, layout: Layout, *, tp: int,
                 seq: int, drop_cross_node_a2a: bool = False, pp: int = 1,
                 packed: bool = False) -> Facts:
    """What the rules read about one candidate layout (as Bridge would run it; ``packed``:
    documents packed (THD), each padded to 2*cp, TE left to detect the padding)."""
    return Facts(
        packed=packed, pad_multiple=2 * layout.cp if packed and layout.cp > 1 else None,
        pp=pp, num_layers=model.layers,
        cp=layout.cp, tp=tp, seq=seq, heads=model.heads, kv_heads=model.kv_heads,
        comm_types=(layout.comm_type if layout.cp > 1 else "p2p",),
        sizes=tuple(layout.sizes) if layout.comm_type == "a2a+p2p" else None,
        gpus_per_node=cluster.gpus_per_node, te=cluster.device == "cuda",
        drop_cross_node_a2a=drop_cross_node_a2a,
    )


def enumerate_layouts(
    model: ModelSpec,
    cluster: ClusterProfile,
    *,
    cp: int,
    tp: int,
    seq: int,
    dp: int = 1,
    pp: int = 1,
    drop_cross_node_a2a: bool = False,
    packed: bool = False,
) -> list[Candidate]:
    """Every split of ``cp`` for one (tp, seq), each kept or rejected with its reasons;
    the rank groups span all ``pp`` pipeline stages; ``packed``: the packed-sequence rules
    apply too (data.packing=thd)."""
    out = []
    for layout in factorizations(cp):
        facts = layout_facts(model, cluster, layout, tp=tp, seq=seq,
                             drop_cross_node_a2a=drop_cross_node_a2a, pp=pp, packed=packed)
        found = evaluate(facts, LAYOUT_RULES)
        dropped = {"a2a-cross-node"} if drop_cross_node_a2a else set()
        reasons = [f.text for f in found if f.severity == "error" or f.rule in dropped]
        flags = [f.text for f in found if f.severity != "error" and f.rule not in dropped]
        groups = rank_groups(layout, tp=tp, dp=dp, pp=pp, gpus_per_node=cluster.gpus_per_node)
        out.append(
            Candidate(layout, tp, seq, dp, not reasons, tuple(reasons), tuple(flags), groups,
                      tuple(found), pp)
        )
    return out
