"""Known upstream causes: which flagged layouts of a ``regress`` comparison match a cause
listed in ``known_causes.yaml`` (package data), by the two tags' Transformer Engine versions,
the key's packing and the layout's comm type and verdict.

A match is printed beside the layout's verdict ("known: TE #3487: ..."); it explains and
never silences: the verdict, the counts and the exit code are ``model.py``'s, untouched.
Pure functions of stored rows and the comparison (standard library and PyYAML).
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Iterable, Optional

from hcp_tune.outputs.regress.rows import COMPARED, fingerprint_of, key_text, row_key

FILE = "known_causes.yaml"  # in hcp_tune/outputs/regress/
CONDITIONS = ("baseline_te", "candidate_te", "te_changed", "packing", "comm_types", "verdicts")
_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt,
        "==": operator.eq, "!=": operator.ne}
_CONDITION = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)\s*$")


def version_tuple(text: Any) -> Optional[tuple[int, ...]]:
    """``2.17.1+4329ff8`` -> (2, 17, 1); ``2.18.0.dev0`` -> (2, 18, 0); None without a
    number (a row from a stack without TE)."""
    nums = re.findall(r"\d+", str(text or "").split("+")[0])
    return tuple(int(n) for n in nums[:3]) or None


def _padded(v: tuple[int, ...]) -> tuple[int, ...]:
    return v + (0,) * (3 - len(v))


def meets(version: tuple[int, ...], conditions: str) -> bool:
    """Whether ``version`` meets every comma-separated condition (``">=2.18,<2.20"``)."""
    for part in str(conditions).split(","):
        m = _CONDITION.match(part)
        if not m:
            raise ValueError(f"{FILE}: version condition {part.strip()!r}: expected e.g. >=2.18")
        if not _OPS[m.group(1)](_padded(version), _padded(version_tuple(m.group(2)))):
            return False
    return True


@dataclass(frozen=True)
class Cause:
    """One entry of the file: what is printed, and when it applies."""

    id: str
    url: str
    cause: str
    source: str
    when: tuple[tuple[str, Any], ...]

    def text(self) -> str:
        return f"known: {self.id}: {self.cause} ({self.url})"


def parse(entries: Any) -> list[Cause]:
    """The file's entries as ``Cause``s; an entry without its fields, or with a condition
    this module does not know, is an error naming it (a typo must not match everything)."""
    if not isinstance(entries, list):
        raise ValueError(f"{FILE}: expected a list of causes")
    out = []
    for i, e in enumerate(entries):
        missing = [f for f in ("id", "url", "cause", "source", "when") if not (e or {}).get(f)]
        if missing:
            raise ValueError(f"{FILE}: entry {i + 1} lacks {', '.join(missing)}")
        unknown = sorted(set(e["when"]) - set(CONDITIONS))
        if unknown:
            raise ValueError(f"{FILE}: entry {i + 1} ({e['id']}): unknown condition(s) "
                             f"{', '.join(unknown)}; expected {', '.join(CONDITIONS)}")
        for side in ("baseline_te", "candidate_te"):
            if side in e["when"]:
                meets((0,), e["when"][side])  # a malformed condition fails here, at load
        out.append(Cause(str(e["id"]), str(e["url"]), " ".join(str(e["cause"]).split()),
                         str(e["source"]), tuple(sorted(e["when"].items()))))
    return out


@lru_cache(maxsize=1)
def shipped() -> tuple[Cause, ...]:
    """The causes shipped with hcp-tune."""
    import yaml

    text = resources.files("hcp_tune.outputs.regress").joinpath(FILE).read_text()
    return tuple(parse(yaml.safe_load(text)))


@dataclass(frozen=True)
class Stack:
    """What the rows of one tag for one key recorded about its software stack."""

    te: frozenset  # TE versions (tuples); empty: none recorded


def stacks(rows: Iterable[dict[str, Any]]) -> dict[tuple[tuple, str], Stack]:
    """(key, tag) -> the TE versions its rows' fingerprints recorded."""
    found: dict[tuple[tuple, str], set] = {}
    for r in rows:
        got = found.setdefault((row_key(r), str(r.get("env_tag"))), set())
        v = version_tuple(fingerprint_of(r).get("transformer_engine"))
        if v is not None:
            got.add(v)
    return {k: Stack(frozenset(v)) for k, v in found.items()}


def applies(cause: Cause, *, base: Stack, cand: Stack, packed: bool, comm_type: str,
            verdict: str) -> bool:
    """Whether every condition of ``cause`` holds for this layout and these two stacks."""
    for name, want in cause.when:
        if name in ("baseline_te", "candidate_te"):
            te = (base if name == "baseline_te" else cand).te
            if not te or not all(meets(v, want) for v in te):
                return False
        elif name == "te_changed":
            if not base.te or not cand.te or (base.te != cand.te) != bool(want):
                return False
        elif name == "packing":
            if ("thd" if packed else "off") != str(want):
                return False
        elif name == "comm_types":
            if comm_type not in [str(x) for x in want]:
                return False
        elif name == "verdicts" and verdict not in [str(x) for x in want]:
            return False
    return True


MIX = COMPARED.index("mix")


def match(report, rows: Iterable[dict[str, Any]],
          causes: Optional[Iterable[Cause]] = None) -> dict[tuple, Cause]:
    """(key, a2a, p2p) -> the first cause that matches, for each flagged layout of
    ``report`` (a ``model.Comparison``) whose key and stacks match one."""
    causes = tuple(shipped() if causes is None else causes)
    st = stacks(rows)
    o = report.options
    out = {}
    for c in report.flagged:
        base = st.get((c.key, o.baseline), Stack(frozenset()))
        cand = st.get((c.key, o.candidate), Stack(frozenset()))
        packed = bool(c.key[MIX])
        hit = next((x for x in causes if applies(
            x, base=base, cand=cand, packed=packed, comm_type=c.comm_type,
            verdict=c.verdict)), None)
        if hit is not None:
            out[(c.key, c.a2a, c.p2p)] = hit
    return out


def lines(report, known: dict[tuple, Cause], verdict_text) -> list[str]:
    """One line per matched layout: its key, layout, verdict (``verdict_text`` of the
    layout, as the table prints it) and the cause beside it."""
    return [f"{key_text(c.key)} {c.layout} {c.comm_type} {verdict_text(c)} "
            f"{known[(c.key, c.a2a, c.p2p)].text()}"
            for c in report.comparisons if (c.key, c.a2a, c.p2p) in known]

