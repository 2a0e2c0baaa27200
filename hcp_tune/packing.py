"""Packed sequences (THD): the document-length mix, how it fills sequences, and how context
parallelism splits each document. Standard library only: the contract both sides import
(the orchestrator reads the mix, the job side partitions the packed stream).

- A **mix** is a histogram of document lengths: a file (CSV ``length,count``, or one length
  per line) or a named preset (``PRESETS``, or ``lognormal:MEDIAN:SIGMA``). Its ``label``
  (name and a short hash of the histogram) joins the sweep key, so recommendations are per mix.
- **Packing** draws documents from the mix with a fixed seed and places them first-fit into
  sequences of ``seq`` tokens, each document padded to a multiple of ``2*cp`` (Megatron-Core
  and TE split every packed document into ``2*cp`` chunks for causal load balance).
- **The CP partition** of one packed sequence: rank ``r`` of ``cp`` holds chunks ``r`` and
  ``2*cp-1-r`` of every (padded) document, as TE's ``thd_get_partitioned_indices`` does.
"""
from __future__ import annotations

import functools
import hashlib
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

PACKINGS = ("off", "thd")
# Named shapes, all log-normal (median tokens, sigma of the log): documents longer than the
# packed sequence are cut to it, as packers truncate them. They are shapes to compare
# against, not claims about any dataset: a user's own histogram (a file) is the real input.
PRESETS: dict[str, tuple[float, float]] = {
    "sft": (600.0, 0.8),       # chat/instruction samples: short, narrow
    "web": (1500.0, 1.1),      # web text: mostly short, a long tail
    "code": (4096.0, 1.0),     # source files and repositories
    "long": (16384.0, 0.9),    # long-document continual pre-training
    "books": (65536.0, 0.8),   # book-length documents
}
PRESET_POINTS = 256  # quantiles that stand for a log-normal preset
DRAW_SEED = 20260  # the draw every layout of a key shares


class MixError(ValueError):
    """A length mix that cannot be used; the message is one line naming what and why."""


@dataclass(frozen=True)
class LengthMix:
    """Document lengths (tokens) and how often each occurs."""

    name: str
    counts: tuple[tuple[int, int], ...]  # (length, count), lengths ascending, counts > 0

    @property
    def digest(self) -> str:
        text = ";".join(f"{n}:{c}" for n, c in self.counts)
        return hashlib.sha256(text.encode()).hexdigest()[:6]

    @property
    def label(self) -> str:
        """What the sweep key stores: ``web#1a2b3c``."""
        return f"{self.name}#{self.digest}"

    @property
    def documents(self) -> int:
        return sum(c for _, c in self.counts)

    @property
    def longest(self) -> int:
        return self.counts[-1][0]

    def cut(self, seq: int) -> "LengthMix":
        """Documents longer than ``seq`` cut to ``seq`` (presets; a file is refused instead)."""
        merged: dict[int, int] = {}
        for n, c in self.counts:
            merged[min(n, seq)] = merged.get(min(n, seq), 0) + c
        return LengthMix(self.name, tuple(sorted(merged.items())))


def preset(name: str) -> LengthMix:
    """A named preset or ``lognormal:MEDIAN:SIGMA`` as a histogram of ``PRESET_POINTS``
    equally likely lengths."""
    if name in PRESETS:
        median, sigma = PRESETS[name]
    else:
        parts = name.split(":")
        try:
            if parts[0] != "lognormal" or len(parts) != 3:
                raise ValueError
            median, sigma = float(parts[1]), float(parts[2])
            if not (median >= 1 and 0 <= sigma <= 4):
                raise ValueError
        except ValueError:
            raise MixError(
                f"data.lengths={name!r}: not a file, and not a preset; expected a file "
                f"(CSV length,count or one length per line), one of {', '.join(PRESETS)}, or "
                "lognormal:MEDIAN:SIGMA (e.g. lognormal:4096:1.0)") from None
    normal = statistics.NormalDist()
    lengths = [max(1, round(median * math.exp(sigma * normal.inv_cdf((i + 0.5) / PRESET_POINTS))))
               for i in range(PRESET_POINTS)]
    merged: dict[int, int] = {}
    for n in lengths:
        merged[n] = merged.get(n, 0) + 1
    return LengthMix(name, tuple(sorted(merged.items())))


def read_file(path: Path) -> LengthMix:
    """A lengths file: CSV ``length,count`` rows (a header line allowed) or one length a line."""
    where = f"data.lengths={str(path)!r}"
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise MixError(f"{where}: cannot read it ({getattr(exc, 'strerror', None) or exc})") \
            from None
    merged: dict[int, int] = {}
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        cells = [c.strip() for c in line.split(",")]
        if i == 1 and not cells[0].lstrip("-").replace(".", "", 1).isdigit():
            continue  # a header (length,count)
        if len(cells) > 2 or not all(c.lstrip("-").isdigit() for c in cells):
            raise MixError(f"{where}: line {i} {raw.strip()!r} is not a length or "
                           "length,count of whole numbers; expected e.g. 4096,120")
        length, count = int(cells[0]), int(cells[1]) if len(cells) == 2 else 1
        if length < 1 or count < 0:
            raise MixError(f"{where}: line {i} {raw.strip()!r}: a length must be >= 1 token "
                           "and a count >= 0")
        if count:
            merged[length] = merged.get(length, 0) + count
    if not merged:
        raise MixError(f"{where}: no document lengths in it; expected CSV length,count rows "
                       "or one length per line")
    return LengthMix(path.name, tuple(sorted(merged.items())))


def load_mix(value: str, seq: int, base: Path | None = None) -> LengthMix:
    """``data.lengths`` as given: a file (relative to ``base``) or a preset; a file's
    document longer than ``seq`` is an error (a preset's is cut to it)."""
    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    if path.is_file():
        mix = read_file(path)
        if mix.longest > seq:
            raise MixError(f"data.lengths={value!r}: a document of {mix.longest} tokens is "
                           f"longer than seq={seq}; expected documents of at most seq tokens "
                           "(cut or drop them in the file, or pack into a longer seq)")
        return mix
    if "/" in value or value.endswith((".csv", ".txt")):
        raise MixError(f"data.lengths={value!r}: no such file; expected a lengths file or a "
                       f"preset ({', '.join(PRESETS)}, lognormal:MEDIAN:SIGMA)")
    return preset(value).cut(seq)


def padded(length: int, cp: int) -> int:
    """A document's length once padded to a multiple of ``2*cp``."""
    unit = 2 * cp
    return -(-length // unit) * unit


def pack(mix: LengthMix, seq: int, cp: int, sequences: int = 1, seed: int = DRAW_SEED
         ) -> list[list[int]]:
    """``sequences`` packed sequences of ``seq`` tokens, each a list of document lengths
    (unpadded), drawn from ``mix`` with ``seed``. Documents are placed first-fit, as
    offline packers place them (Megatron-Bridge's default ``first_fit_shuffle``): each
    drawn document, at its padded length, goes into the first open sequence with room, else
    opens a new one; the first ``sequences`` sequences opened (the ones first-fit has had
    the most chances to fill) are returned once enough has been drawn to fill two more."""
    rng = random.Random(seed)
    lengths = [n for n, _ in mix.counts]
    weights = [c for _, c in mix.counts]
    bins: list[list[int]] = []
    room: list[int] = []
    unit = 2 * cp
    drawn, target = 0, (sequences + 2) * seq
    while drawn < target:
        doc = min(rng.choices(lengths, weights)[0], seq - seq % unit if seq % unit else seq)
        need = padded(doc, cp)
        at = next((i for i, r in enumerate(room) if r >= need), None)
        if at is None:
            bins.append([])
            room.append(seq)
            at = len(bins) - 1
        bins[at].append(doc)
        room[at] -= need
        drawn += need
    return bins[:sequences]


def typical(mix: LengthMix, seq: int, cp: int, sequences: int = 1, pool: int = 32
            ) -> list[list[int]]:
    """The ``sequences`` packed sequences a trial times: of ``pool`` drawn (``pack``), those
    whose attention work (``sum(d^2)``) is nearest the pool's median, in the order drawn.
    One draw alone can be far from the mix (two long documents, or many short ones); every
    layout of a key times the same ones."""
    return [list(s) for s in _typical(mix, seq, cp, sequences, pool)]


@functools.lru_cache(maxsize=64)
def _typical(mix: LengthMix, seq: int, cp: int, sequences: int, pool: int
             ) -> tuple[tuple[int, ...], ...]:
    """``typical``'s draw, once per key: a sweep builds a spec per trial (0.3 s a draw at
    seq=1M), and every trial of a key times the same sequences."""
    seqs = pack(mix, seq, cp, max(pool, sequences))
    work = [sum(d * d for d in s) for s in seqs]
    mid = statistics.median(work)
    chosen = sorted(sorted(range(len(seqs)), key=lambda i: (abs(work[i] - mid), i))[:sequences])
    return tuple(tuple(seqs[i]) for i in chosen)


@dataclass(frozen=True)
class MixSummary:
    """What a mix means for one packed length and CP: printed by ``plan``."""

    docs_per_seq: float  # documents in a packed sequence, on average
    attention_fraction: float  # causal attention work sum(d^2) / S^2 against one document
    padding_overhead: float  # tokens added by the 2*cp padding, per real token
    fill: float  # real tokens per sequence slot (what padding and unfilled tails leave)
    longest: int

    def line(self) -> str:
        return (f"{self.docs_per_seq:.1f} documents a sequence; attention work "
                f"{self.attention_fraction:.1%} of one seq-long document; 2*cp padding "
                f"+{self.padding_overhead:.2%}; {self.fill:.1%} of each sequence real tokens")


def summarise(mix: LengthMix, seq: int, cp: int, sequences: int = 64) -> MixSummary:
    seqs = pack(mix, seq, cp, sequences)
    real = [sum(s) for s in seqs]
    pad = [sum(padded(d, cp) - d for d in s) for s in seqs]
    return MixSummary(
        docs_per_seq=statistics.fmean(len(s) for s in seqs),
        attention_fraction=statistics.fmean(sum(d * d for d in s) / seq ** 2 for s in seqs),
        padding_overhead=sum(pad) / max(1, sum(real)),
        fill=sum(real) / (seq * len(seqs)),
        longest=max(max(s) for s in seqs),
    )


def cu_seqlens(docs: list[int], cp: int = 0) -> list[int]:
    """Cumulative document offsets (``cu_seqlens``), padded to ``2*cp`` when ``cp`` > 0
    (``cu_seqlens_padded``); the padded stream's last offset is its length."""
    out = [0]
    for d in docs:
        out.append(out[-1] + (padded(d, cp) if cp else d))
    return out


def rank_ranges(docs: list[int], cp: int, rank: int) -> list[tuple[int, int]]:
    """The token ranges (start, end) of the padded packed stream that CP rank ``rank`` holds:
    chunks ``rank`` and ``2*cp-1-rank`` of each document, in stream order."""
    out = []
    for start, end in zip(cu_seqlens(docs, cp), cu_seqlens(docs, cp)[1:]):
        chunk = (end - start) // (2 * cp)
        out.append((start + rank * chunk, start + (rank + 1) * chunk))
        out.append((start + (2 * cp - 1 - rank) * chunk, start + (2 * cp - rank) * chunk))
    return out
