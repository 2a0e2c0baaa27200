"""Packed sequences (THD) in the cost model: the attention work a length mix leaves, how it
falls on the ranks of one layout, and whether the model has been checked on packed data.
Standard library only (``hcp_tune.packing`` draws and pads the documents).

What packing changes, per packed sequence of ``S`` tokens (``packing.pack``: the documents
the trials run, the same fixed draw):

- **Work**: attention runs within each document, so its FLOPs are ``sum(d_i^2)`` of the
  documents' real lengths instead of ``S^2`` (``work_fraction``; padding does no work).
- **Balance**: Megatron-Core and TE split every document, padded to a multiple of ``2*cp``,
  into ``2*cp`` chunks; CP position ``r`` holds chunks ``r`` and ``2*cp-1-r``. A padded
  document's chunks balance exactly, but the padding sits at its end (chunk ``2*cp-1``, on
  position 0), so the real work of position ``r`` is counted chunk by chunk
  (``chunk_work``). After the all-to-all a rank of a2a group ``g`` (positions ``g*a`` ..
  ``g*a+a-1``, contiguous: hcp-facts.md section 2) computes its group's work over ``a`` ranks
  by heads; the ring waits for the slowest group: ``imbalance = max_g W_g / mean_g W_g``.
- **Kernels**: a document's share of one ring step's kernel is ``D/p2p`` tokens (its padded
  length over the ring), shorter than ``S/p2p``: the short-block efficiency is taken per
  document, weighted by its work (``inverse_efficiency``).
- **Unchanged**: every tensor is still ``S`` tokens a sequence (padding and the unfilled
  tail included), so the all-to-all volume per token, the ring's K/V blocks and the GEMMs
  are those of the fixed-length key.

The model's error band was measured on fixed-length keys only, so a packed key's
predictions say "not validated on packed data" until a calibration fitted on packed rows
is in use (``validated``).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Optional

from hcp_tune.packing import LengthMix, MixError, load_mix, pack, padded, preset, summarise

NOT_VALIDATED = "not validated on packed data"


def _causal(a: int, b: int) -> int:
    """Keys attended by queries ``a .. b-1`` of one document (query q sees q+1 keys)."""
    return (b * (b + 1) - a * (a + 1)) // 2 if b > a else 0


def chunk_work(d: int, cp: int) -> list[int]:
    """Real causal work (query-key pairs) of each CP position for one document of ``d``
    real tokens: position ``r`` holds chunks ``r`` and ``2*cp-1-r`` of its padded length."""
    size = padded(d, cp) // (2 * cp)
    chunk = [_causal(min(i * size, d), min((i + 1) * size, d)) for i in range(2 * cp)]
    return [chunk[r] + chunk[2 * cp - 1 - r] for r in range(cp)]


@dataclass(frozen=True)
class PackedWork:
    """What one layout of a packed key computes, from the sequences its trials run."""

    mix: str  # the mix's label (name#hash)
    seq: int
    cp: int
    a2a: int
    sequences: int
    work_fraction: float  # sum(d^2) / (sequences * S^2): attention work against fixed length
    imbalance: float  # slowest a2a group's work / the mean group's (1: balanced)
    docs: tuple[tuple[int, int], ...]  # (real length, padded length) of every document
    docs_per_seq: float
    padding_overhead: float  # 2*cp padding tokens per real token
    fill: float  # real tokens per sequence slot

    @property
    def p2p(self) -> int:
        return self.cp // self.a2a

    def inverse_efficiency(self, efficiency: Callable[[float], float]) -> float:
        """The work-weighted mean of ``1/efficiency(L)`` over the documents, ``L = D/p2p``
        the document's share of one ring step's kernel."""
        weights = [d * d for d, _ in self.docs]
        total = sum(weights)
        if not total:
            return 1.0 / efficiency(self.seq / self.p2p)
        return sum(w / efficiency(dp / self.p2p) for w, (_, dp) in zip(weights, self.docs)) / total

    def as_dict(self, validated: bool) -> dict:
        return {"mix": self.mix, "sequences": self.sequences,
                "docs_per_seq": self.docs_per_seq, "attention_fraction": self.work_fraction,
                "imbalance": self.imbalance, "padding_overhead": self.padding_overhead,
                "fill": self.fill, "validated": validated,
                "note": "" if validated else NOT_VALIDATED}


@lru_cache(maxsize=512)
def packed_work(mix: LengthMix, seq: int, cp: int, a2a: int, sequences: int = 1) -> PackedWork:
    """The work of ``sequences`` packed sequences of ``mix`` (``packing.pack``'s draw: the
    sequences a trial with ``mbs = sequences`` runs) on a layout with ``a2a`` of ``cp``."""
    if cp < 1 or a2a < 1 or cp % a2a:
        raise ValueError(f"packed_work: a2a={a2a} must divide cp={cp}")
    seqs = pack(mix, seq, cp, sequences)
    worst = mean = 0.0
    for docs in seqs:
        pos = [0] * cp
        for d in docs:
            for r, w in enumerate(chunk_work(d, cp)):
                pos[r] += w
        groups = [sum(pos[g * a2a:(g + 1) * a2a]) for g in range(cp // a2a)]
        worst += max(groups)
        mean += sum(groups) / len(groups)
    s = summarise(mix, seq, cp, sequences)
    return PackedWork(
        mix=mix.label, seq=seq, cp=cp, a2a=a2a, sequences=len(seqs),
        work_fraction=sum(d * d for docs in seqs for d in docs) / (len(seqs) * seq * seq),
        imbalance=worst / mean if mean else 1.0,
        docs=tuple((d, padded(d, cp)) for docs in seqs for d in docs),
        docs_per_seq=s.docs_per_seq, padding_overhead=s.padding_overhead, fill=s.fill)


def mix_of_row(row: dict) -> Optional[LengthMix]:
    """A measured row's length mix, rebuilt for the cost model: None for a fixed-length
    row; a preset from its label's name (the hash must match), or the file ``row["lengths"]``
    names. A ``ValueError`` names a packed row whose mix cannot be rebuilt."""
    label = str(row.get("mix") or "")
    if not label:
        return None
    name, _, digest = label.rpartition("#")
    seq = int(row["seq"])
    try:
        mix = (load_mix(str(row["lengths"]), seq, base=Path.cwd()) if row.get("lengths")
               else preset(name).cut(seq))
    except MixError as exc:
        raise ValueError(f"row mix={label!r}: {exc}; give the row its lengths file as "
                         '"lengths": FILE') from None
    if mix.digest != digest:
        raise ValueError(f"row mix={label!r}: the rebuilt mix hashes to {mix.digest}, not "
                         f"{digest}; give the row the lengths file it was swept with as "
                         '"lengths": FILE')
    return mix


def validated(calibration: Optional[dict]) -> bool:
    """Whether a calibration document (``calibrate.save_params``) was fitted on packed rows:
    only then is a packed key's prediction inside what the model was checked on."""
    return bool(((calibration or {}).get("fit") or {}).get("packed_rows"))
