"""How well the cost model orders the splits of measured rows: the check against published
tables (``benchmarks/published/``) and the project's own measurements.

Rows are calibration rows (``calibrate.read_rows``): one per measured split, grouped into
keys of the same cluster, model dims, tp, cp and seq. Per key: Kendall's tau between the
predicted and the measured order of the splits, whether the predicted best is in the
measured top two, and how much slower the predicted best measured than the measured best.
Standard library only; no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from hcp_tune.costmodel.calibrate import _resolve, predict_row, split_key
from hcp_tune.costmodel.formulas import CostParams


def kendall_tau(x: list[float], y: list[float]) -> float:
    """Kendall's tau-a of two equally long sequences: (concordant - discordant) / pairs."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError(f"kendall_tau needs two sequences of the same length >= 2, got "
                         f"{len(x)} and {len(y)}")
    pairs = [(i, j) for i in range(len(x)) for j in range(i + 1, len(x))]
    sign = lambda v: (v > 0) - (v < 0)  # noqa: E731
    return sum(sign(x[i] - x[j]) * sign(y[i] - y[j]) for i, j in pairs) / len(pairs)


@dataclass(frozen=True, kw_only=True)
class KeyAgreement:
    """One key's splits: measured and predicted seconds by a2a size, and the agreement."""

    key: str
    a2a_sizes: tuple[int, ...]
    measured_s: tuple[float, ...]
    predicted_s: tuple[float, ...]

    @property
    def tau(self) -> float:
        return kendall_tau(list(self.measured_s), list(self.predicted_s))

    def _order(self, times) -> list[int]:
        return [a for _, a in sorted(zip(times, self.a2a_sizes))]

    @property
    def measured_order(self) -> list[int]:
        return self._order(self.measured_s)

    @property
    def predicted_order(self) -> list[int]:
        return self._order(self.predicted_s)

    @property
    def best_in_top_two(self) -> bool:
        return self.predicted_order[0] in self.measured_order[:2]

    @property
    def slowdown(self) -> float:
        """Measured time of the predicted best / measured best - 1."""
        t = dict(zip(self.a2a_sizes, self.measured_s))
        return t[self.predicted_order[0]] / min(self.measured_s) - 1.0


def keys_of(rows: list[dict], *, clusters=None, models=None) -> list[str]:
    """The key of each row (rows of one key are the splits the model must order)."""
    return [split_key(*x) for x in _resolve(rows, clusters, models)]


def agreement(rows: list[dict], params: CostParams = CostParams(), *, clusters=None,
              models=None) -> list[KeyAgreement]:
    """Per key of ``rows`` (one cluster and env tag), in the order the keys first appear."""
    keys: dict[str, list] = {}
    for model, cluster, cand, r in _resolve(rows, clusters, models):
        key = split_key(model, cluster, cand, r)
        pred = predict_row(model, cluster, cand, r, params).step_time_s
        keys.setdefault(key, []).append((cand.layout.a2a, float(r["median_s"]), pred))
    out = []
    for key, splits in keys.items():
        splits.sort(reverse=True)
        out.append(KeyAgreement(key=key, a2a_sizes=tuple(s[0] for s in splits),
                                measured_s=tuple(s[1] for s in splits),
                                predicted_s=tuple(s[2] for s in splits)))
    return out


def table(result: list[KeyAgreement]) -> str:
    """Markdown: each key's measured and predicted order, tau, top-two, slowdown."""
    lines = ["| key | measured order (fastest first, a2a size) | predicted order | tau | "
             "predicted best in measured top 2 | its slowdown vs measured best |",
             "|---|---|---|---|---|---|"]
    for k in result:
        lines.append(f"| {k.key} | {k.measured_order} | {k.predicted_order} | {k.tau:+.2f} | "
                     f"{'yes' if k.best_in_top_two else 'no'} | {k.slowdown:.1%} |")
    taus = [k.tau for k in result]
    lines.append(f"| **all {len(result)}** | | | **{sum(taus) / len(taus):+.2f}** | "
                 f"**{sum(k.best_in_top_two for k in result)}/{len(result)}** | "
                 f"**max {max(k.slowdown for k in result):.1%}** |")
    return "\n".join(lines)


# TE's attention study (upstream-facts-2.md section 5): H100 and B200, 32 Q / 8 KV heads,
# head_dim 128; winners over 36 tuples: CP2 P2P 19 / all-gather 13 / A2A 4, CP4 A2A 30 /
# P2P 6, CP8 A2A 33 / P2P 3. Its tuples are not published; this grid stands in for them.
TE_STUDY_CLUSTERS = ("dgx-h100", "gb200-nvl72")
TE_STUDY_SEQS = (8192, 16384, 32768, 65536, 131072)
TE_STUDY_MBS = (1, 2)


def te_study_winners(cp: int, clusters: dict, params: CostParams = CostParams()) -> dict:
    """Pure p2p ``[1,cp]`` against pure a2a ``[cp,1]`` (one attention layer, forward and
    backward) over the study's clusters (``clusters``: name -> profile), the sequence
    lengths and micro-batches above: how often each wins, per cluster and in all."""
    from hcp_tune.config.model import ModelSpec
    from hcp_tune.costmodel.formulas import predict_attention_layer
    from hcp_tune.space.layout import Candidate, Layout, rank_groups

    model = ModelSpec(name="te-study", layers=1, hidden=4096, ffn_hidden=14336, heads=32,
                      kv_heads=8, head_dim=128, vocab=1)
    wins = {name: {"p2p": 0, "a2a": 0} for name in clusters}
    for name, cluster in clusters.items():
        for seq in TE_STUDY_SEQS:
            for mbs in TE_STUDY_MBS:
                t = {}
                for kind, lay in (("p2p", Layout(1, cp)), ("a2a", Layout(cp, 1))):
                    groups = rank_groups(lay, tp=1, dp=1, gpus_per_node=cluster.gpus_per_node)
                    c = Candidate(lay, 1, seq, 1, True, groups=groups)
                    t[kind] = predict_attention_layer(model, cluster, c, mbs=mbs,
                                                      params=params).step_time_s
                wins[name][min(t, key=t.get)] += 1
    wins["all"] = {k: sum(w[k] for w in wins.values()) for k in ("p2p", "a2a")}
    return wins
