"""How much a session moves step times: what ``regress`` needs to tell a release from the
session a tag ran in (one session per tag). Two figures, both relative standard
deviations (0.01 = 1%):

- ``session`` (S): the shift one session gives every layout (the nodes, the fabric, the
  thermal state of that allocation). Two tags, one session each: their common shift differs
  by N(0, 2 S^2) with no release change at all.
- ``layout`` (L): each layout's own meeting with a session, on top of the shift (the ring
  more than the all-to-all when the network is busy): N(0, 2 L^2) per layout.

Where they come from, first found wins (``resolve``):

1. given: ``regress ... session_spread=S layout_spread=L``;
2. learned from the folder's history: a **stack** (the versions and settings of a row's
   fingerprint, host names aside) measured under two or more env tags is the same software
   measured in several sessions; their differences are session effects. A two-way
   random-effects analysis of variance (method of moments) over the layouts every session
   of a stack measured gives S^2 and L^2 (``components``). The candidate's tag never counts
   (it is what is being judged); needs ``HISTORY_DF`` session degrees of freedom in all;
3. the cluster profile's ``session_spread`` / ``layout_spread`` (``conf/cluster/*.yaml``:
   measured on recorded sessions; the largest over the clusters compared), or
   ``FALLBACK`` for a cluster without a profile.

Interleaved runs (``regress run``) share the session between tags: S and L cancel there
and are not used. Standard library and numpy only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from hcp_tune.config.cluster import RECORDED_LAYOUT_SPREAD, RECORDED_SESSION_SPREAD
from hcp_tune.outputs.regress.rows import RegressError, _flat, fingerprint_of, row_key, usable

HISTORY_DF = 2  # session degrees of freedom (sessions - 1, summed over stacks) to learn from
FALLBACK = (RECORDED_SESSION_SPREAD, RECORDED_LAYOUT_SPREAD)  # a cluster without a profile


@dataclass(frozen=True)
class Spread:
    session: float  # S: relative sd of one tag's session shift
    layout: float  # L: relative sd of a layout x session effect
    source: str  # where the figures come from, as printed

    def text(self) -> str:
        return (f"session spread S={self.session * 100:.2g}%, layout spread "
                f"L={self.layout * 100:.2g}% ({self.source})")


def parse_fraction(args: dict[str, str], key: str) -> Optional[float]:
    """``session_spread=`` / ``layout_spread=``: a fraction in [0, 1), or None when absent."""
    if key not in args:
        return None
    try:
        value = float(args[key])
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value < 1):
        raise RegressError(f"{key}={args[key]}: expected a relative standard deviation, a "
                           f"fraction in [0, 1), e.g. {key}=0.01 (1%)")
    return value


def components(cells: dict[tuple, dict[Any, tuple[float, float, int]]]
               ) -> Optional[tuple[float, float, int, int]]:
    """(S^2, L^2, session df, interaction df) from the cells of several stacks: ``cells[stack]
    [(layout, session)] = (mean log step, within variance, trials)``; per stack only the
    layouts every session measured, 2 or more layouts and sessions. The mean squares of a
    two-way layout x session table: E[MS_interaction] = L^2 + v, E[MS_session] = I S^2 + L^2
    + v (v: the mean squared standard error of a cell mean, I: the layouts); pooled over
    stacks by their degrees of freedom and clipped at 0. None when nothing qualifies."""
    import numpy as np

    s_num = s_df = l_num = l_df = 0.0
    for table in cells.values():
        sessions = sorted({s for _, s in table}, key=str)
        layouts = [lay for lay in sorted({lay for lay, _ in table}, key=str)
                   if all((lay, s) in table for s in sessions)]
        if len(sessions) < 2 or len(layouts) < 2:
            continue
        y = np.array([[table[(lay, s)][0] for s in sessions] for lay in layouts])
        v = float(np.mean([[table[(lay, s)][1] / table[(lay, s)][2] for s in sessions]
                           for lay in layouts]))
        n_i, n_j = y.shape
        resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
        ms_i = float((resid ** 2).sum()) / ((n_i - 1) * (n_j - 1))
        ms_s = n_i * float(((y.mean(0) - y.mean()) ** 2).sum()) / (n_j - 1)
        l_num += (n_i - 1) * (n_j - 1) * max(0.0, ms_i - v)
        l_df += (n_i - 1) * (n_j - 1)
        s_num += (n_j - 1) * max(0.0, (ms_s - ms_i) / n_i)
        s_df += n_j - 1
    if not s_df:
        return None
    return s_num / s_df, l_num / l_df, int(s_df), int(l_df)


def _stack(rows: list[dict]) -> Optional[frozenset]:
    """A tag's stack: the one fingerprint its rows share (host names aside); None if mixed."""
    prints = {frozenset(_flat(fingerprint_of(r)).items()) for r in rows}
    return prints.pop() if len(prints) == 1 else None


def from_history(rows: Iterable[dict], candidate: str) -> Optional[Spread]:
    """S and L learned from every stack measured under two or more tags (the candidate's
    tag left out), or None when the folder holds fewer than ``HISTORY_DF`` session
    degrees of freedom."""
    by_tag: dict[str, list[dict]] = {}
    for r in rows:
        if usable(r) and str(r.get("env_tag")) != candidate:
            by_tag.setdefault(str(r.get("env_tag")), []).append(r)
    cells: dict[tuple, dict] = {}
    tags_of: dict[tuple, list[str]] = {}
    for tag, got in by_tag.items():
        stack = _stack(got)
        if stack is None:
            continue
        groups: dict[tuple, list[float]] = {}
        for r in got:
            groups.setdefault((row_key(r), int(r["a2a"])), []).append(math.log(float(r["median_s"])))
        for (key, a2a), logs in groups.items():
            if len(logs) < 2:
                continue
            m = sum(logs) / len(logs)
            var = sum((x - m) ** 2 for x in logs) / (len(logs) - 1)
            cells.setdefault((stack, key[0]), {})[((key, a2a), tag)] = (m, var, len(logs))
            tags_of.setdefault((stack, key[0]), [])
            if tag not in tags_of[(stack, key[0])]:
                tags_of[(stack, key[0])].append(tag)
    got = components(cells)
    if got is None or got[2] < HISTORY_DF:
        return None
    s2, l2, s_df, l_df = got
    sessions = sorted({t for ts in tags_of.values() if len(ts) > 1 for t in ts})
    return Spread(math.sqrt(s2), math.sqrt(l2), f"learned from {len(sessions)} sessions in "
                  f"this folder ({', '.join(sessions[:6])}{', ...' if len(sessions) > 6 else ''}"
                  f"; {s_df} and {l_df} degrees of freedom)")


def from_profiles(clusters: Iterable[str]) -> Spread:
    """The largest stated figures over the clusters' profiles; ``FALLBACK`` for a cluster
    without one."""
    from hcp_tune.config import option_file

    found = []
    for name in sorted(set(clusters)):
        path = option_file("cluster", name)
        profile = _profile(str(path), name) if path else None
        if profile is None:
            found.append((*FALLBACK, f"cluster {name}: no profile, the recorded H200 sessions"))
        else:
            found.append((profile.session_spread, profile.layout_spread,
                          f"cluster profile {name}"))
    if not found:
        return Spread(*FALLBACK, "the recorded H200 sessions")
    s = max(found, key=lambda f: f[0])
    return Spread(s[0], max(f[1] for f in found), "; ".join(sorted({f[2] for f in found})))


def _profile(path: str, name: str):
    import yaml

    from hcp_tune.config.cluster import cluster_from_mapping

    try:
        with open(path) as fh:
            return cluster_from_mapping(yaml.safe_load(fh), name)
    except Exception:  # noqa: BLE001 - a broken profile: the sweep names it; use the fallback
        return None


def resolve(given: tuple[Optional[float], Optional[float]], rows: list[dict],
            candidate: str, clusters: Iterable[str]) -> Spread:
    """The S and L a comparison uses: given, else learned from ``rows`` (every tag's),
    else the ``clusters``' profiles'."""
    session, layout = given
    if session is not None and layout is not None:
        return Spread(session, layout, "given")
    base = from_history(rows, candidate) or from_profiles(clusters)
    if session is None and layout is None:
        return base
    return Spread(base.session if session is None else session,
                  base.layout if layout is None else layout,
                  f"{'layout' if session is None else 'session'} spread given, the other "
                  f"{base.source}")
