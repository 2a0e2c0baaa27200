"""Simulated nights for ``regress_error_rates.py``: rows shaped as the store writes them, the
trials drawn by the synthetic runner's own code (``hcp_tune.engine.synthetic``: its noise
kinds, its layout x session effects, its drift), every verdict from ``regress.compare``.

**A night**: 12 keys (seq 8K-64K x cp 8, 16, 32) x 4 layouts (a2a 1, 2, 4, 8 of each) = 48
layouts, ``n`` trials per tag. Each tag is one session (``design=sessions``): its common
shift drawn once per night and tag, N(0, S) (or fixed), and each layout's own effect
N(0, L) drawn by ``synthetic.session_effects`` from that tag's seed. Interleaved nights
(``design=interleaved``) put both tags in one session, in ``plan.run_order``'s order, the
drift linear over the allocation. Slowed layouts get the candidate's median x (1 + effect).

**Held out.** ``FROZEN_AT`` is the commit the rule was frozen at; ``RULE_FILES`` are what
decides a verdict. ``frozen()`` says whether any of them changed since (committed or not):
the results file calls its figures held out only when none did. While the rule was built,
only seeds below 1000 and the regimes marked ``tuned`` were run; the file's figures use
seeds from 1,000,000.
"""
from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from hcp_tune.engine import synthetic  # noqa: E402
from hcp_tune.outputs.regress import Options, compare  # noqa: E402
from hcp_tune.outputs.regress.plan import run_order  # noqa: E402
from frozen import changed_since as rule_changes  # noqa: E402

FROZEN_AT = "dd883d9"  # the rule of issue 36 part 3 (first frozen at 963b5fb; re-frozen after
# the shared moderation changed under it at ace6239: git log -1 cb6d986; and at dd883d9 for a
# case outside these nights, a paired run of one key's 4 layouts, found by running it)
RULE_FILES = ("hcp_tune/outputs/regress/stats.py", "hcp_tune/outputs/regress/model.py",
              "hcp_tune/outputs/regress/spread.py", "hcp_tune/stats/shrinkage.py",
              "hcp_tune/config/cluster.py", "conf/cluster/dgx-h100.yaml")
SEQS = (8192, 16384, 32768, 65536)
CPS = (8, 16, 32)
A2A = (1, 2, 4, 8)
LAYOUTS = [(seq, cp, a2a) for seq in SEQS for cp in CPS for a2a in A2A]  # 48
CLUSTER = "dgx-h100"  # its profile's S and L are the defaults a night is judged with
CUDA_MEM = "torch.cuda.max_memory_allocated over the measured steps, max over ranks"
STEPS = 10


def frozen() -> tuple[bool, str]:
    """(no rule file changed since FROZEN_AT, the reason when one did)."""
    if FROZEN_AT == "UNFROZEN":
        return False, "the rule is not frozen (FROZEN_AT unset)"
    changed = rule_changes(FROZEN_AT, RULE_FILES)  # code compared, a moved file followed
    if changed is None:
        return False, f"freeze commit {FROZEN_AT} not found"
    return not changed, f"changed since {FROZEN_AT}: {', '.join(changed)}" if changed else ""


@dataclass(frozen=True)
class Regime:
    name: str
    n: int = 10  # trials per tag and layout
    sd: float = 0.02  # per-trial relative spread
    kind: str = "lognormal"  # synthetic noise kind
    slowed: tuple[int, ...] = ()  # indices into LAYOUTS
    effect: float = 0.07
    session: float = 0.0  # true S (each tag's shift ~ N(0, S))
    layout: float = 0.0  # true L
    fixed_shift: float = 0.0  # the candidate's session: this much slower, every night
    given: Optional[tuple[float, float]] = None  # session_spread=, layout_spread=
    design: str = "sessions"
    order: str = "ABBA"  # interleaved: ABBA (regress run) or ABAB
    drift: float = 0.0  # interleaved: total change over the allocation
    goal: str = ""
    check: Optional[str] = None  # "aa", "power", "release": what the goal needs
    tuned: bool = False  # run while the rule was being built (seeds < 1000)
    name_as: str = ""  # the shared level the output should name ("a2a > 1")
    extra: dict = field(default_factory=dict)


def noise(r: Regime) -> synthetic.Noise:
    if r.kind == "bimodal":
        return synthetic.Noise("bimodal", r.sd, 0.3, 0.06)
    return synthetic.Noise(r.kind, r.sd)


def _row(tag, seq, cp, a2a, number, median, mem):
    slug = f"s{seq}c{cp}"
    return {"cluster": CLUSTER, "model": "llama3-8b", "tp": 1, "pp": 1, "cp": cp, "seq": seq,
            "runner": "synthetic", "env_tag": tag, "a2a": a2a, "p2p": cp // a2a,
            "comm_type": "a2a+p2p" if 1 < a2a < cp else ("a2a" if a2a == cp else "p2p"),
            "median_s": median, "status": "ok", "verified": True, "peak_mem_bytes": mem,
            "mem_note": CUDA_MEM, "trial_id": f"{slug}-t{number:03d}-a{a2a}",
            "fingerprint": "{}"}


def night_rows(r: Regime, seed: int) -> list[dict]:
    """One night's rows under tags ``base`` and ``cand``."""
    import numpy as np

    rng = np.random.default_rng([seed, 7])
    shifts = {"base": 0.0, "cand": math.log1p(r.fixed_shift)}
    if r.design == "sessions":
        shifts = {t: s + r.session * float(rng.standard_normal()) for t, s in shifts.items()}
    rows = []
    slowed = set(r.slowed)
    session = synthetic.Session(0.0, r.layout, r.drift)
    truths = {}  # (tag, seq, cp) -> the key's truth: its 4 layouts
    for tag in ("base", "cand"):
        for seq in SEQS:
            for cp in CPS:
                lays = {}
                for a2a in A2A:
                    i = LAYOUTS.index((seq, cp, a2a))
                    f = (1 + r.effect) if tag == "cand" and i in slowed else 1.0
                    median = (0.01 * (1 + SEQS.index(seq)) * (1 + 0.1 * a2a) * f
                              * math.exp(shifts[tag]))
                    lays[a2a] = synthetic.LayoutTruth(median, noise(r), 40.0 + i)
                truths[(tag, seq, cp)] = synthetic.Truth(lays, session)
    if r.design == "sessions":
        slots = [(tag, t) for tag in ("base", "cand") for t in range(r.n)]
        where = {s: 0.0 for s in slots}
    else:  # one allocation: round by round in regress run's order, each sweep all layouts
        if r.order == "ABBA":
            slots = [(tag, k - 1) for k, tag in run_order("base", "cand", r.n)]
        else:
            slots = [(tag, t) for t in range(r.n) for tag in ("base", "cand")]
        where = {s: j / max(1, len(slots) - 1) for j, s in enumerate(slots)}
    for tag, t in slots:
        # sessions: each tag its own session (seed); interleaved: one session for both
        sess_seed = seed * 2 + (tag == "cand") if r.design == "sessions" else seed * 2
        for seq, cp, a2a in LAYOUTS:
            truth = truths[(tag, seq, cp)]
            lay = truth.layouts[a2a]
            steps = synthetic.draw_steps(truth, a2a, seed=sess_seed, key=f"{seq}/{cp}",
                                         number=t * 2 + (tag == "cand"), position=where[(tag, t)],
                                         steps=STEPS)
            mem = int(lay.peak_mem_gib * 2 ** 30 * math.exp(0.002 * float(rng.standard_normal())))
            rows.append(_row(tag, seq, cp, a2a, t, statistics.median(steps), mem))
    return rows


def options(r: Regime) -> Options:
    s, lay = r.given or (None, None)
    return Options(baseline="base", candidate="cand", design=r.design, session_spread=s,
                   layout_spread=lay)


@dataclass
class Tally:
    nights: int = 0
    flagged: int = 0  # nights with any confirmed change (a layout or a shift)
    false_nights: int = 0  # nights with an unchanged layout flagged, or a shift on A/A
    hits: int = 0  # slowed layouts confirmed (their own flag, or the release's shift)
    exits: dict = field(default_factory=lambda: {0: 0, 1: 0, 4: 0})
    named: int = 0  # nights whose output named the slowed layouts' shared level
    release: int = 0  # nights the common shift was a REGRESSION of the release
    spread: str = ""


def run_regime(r: Regime, nights: int, seed: int) -> Tally:
    from hcp_tune.outputs.regress.view import shared_levels

    out = Tally()
    slowed = {LAYOUTS[i] for i in r.slowed}
    for k in range(nights):
        rep = compare(night_rows(r, seed + k), options(r))
        out.nights += 1
        out.exits[rep.exit_code] = out.exits.get(rep.exit_code, 0) + 1
        shift = rep.shift.verdict if rep.shift else "ok"
        flags = [(c.key[5], c.key[4], c.a2a) for c in rep.flagged]
        out.flagged += bool(flags or rep.shift_flagged)
        wrong = [f for f in flags if f not in slowed]
        release = shift == "regression" and len(slowed) == len(LAYOUTS)
        out.false_nights += bool(wrong or (rep.shift_flagged and not release))
        want = "regression" if r.effect > 0 else "improvement"
        out.hits += sum(1 for c in rep.flagged if (c.key[5], c.key[4], c.a2a) in slowed
                        and c.verdict == want) if not release else len(slowed)
        lines = shared_levels(rep)
        out.named += any(f"with {r.name_as} " in x for x in lines) if r.name_as else bool(lines)
        out.release += shift == "regression"
        out.spread = rep.spread.text() if rep.spread else "not used (interleaved)"
    return out


# ---------------------------------------------------------------- the regimes and their table

def _slowed(test) -> tuple[int, ...]:
    return tuple(i for i, lay in enumerate(LAYOUTS) if test(*lay))


K = {6: _slowed(lambda seq, cp, a2a: a2a == 2 and seq <= 16384),  # 6 keys' [2,cp/2]: no name
     12: _slowed(lambda seq, cp, a2a: a2a == 8),  # a2a=8 everywhere: named
     24: _slowed(lambda seq, cp, a2a: seq <= 16384),  # two seqs: no single name
     36: _slowed(lambda seq, cp, a2a: a2a > 1),  # the all-to-all path: named
     48: tuple(range(48))}
NAMES = {12: "a2a=8", 36: "a2a > 1"}
DEF = dict(session=0.005, layout=0.001)  # dgx-h100's stated S and L, drawn as the truth
S1 = dict(session=0.01, layout=0.005, given=(0.01, 0.005))


def regimes() -> list[Regime]:
    aa, pw, rel = "aa", "power", "release"
    out = [Regime("A/A, fixed 3% shift, sigma 3%, 5 trials", n=5, sd=0.03, fixed_shift=0.03,
                  check=aa, tuned=True, **DEF),
           Regime("A/A, sigma 2%, 10 trials", check=aa, tuned=True, **DEF)]
    out += [Regime(f"{k} of 48 slowed 7%, sigma 2%, 10 trials", slowed=K[k],
                   check=rel if k == 48 else pw, tuned=True, name_as=NAMES.get(k, ""), **DEF)
            for k in K]
    out += [Regime("every layout slowed 7%, sigma 3%, 5 trials", n=5, sd=0.03, slowed=K[48],
                   check=rel, **DEF),
            Regime("A/A, t3 tails, sigma 2%, 10 trials", kind="t3", check=aa, **DEF),
            Regime("A/A, bimodal (30% of trials 6% slow), sigma 1%, 10 trials",
                   kind="bimodal", sd=0.01, check=aa, **DEF),
            Regime("6 of 48 slowed 7%, t3 tails, sigma 2%, 10 trials", kind="t3",
                   slowed=K[6], check=pw, **DEF)]
    out += [Regime(f"given S=1% L=0.5%: {k} of 48 slowed 7%, sigma 2%, 10 trials",
                   slowed=K[k], check=rel if k == 48 else pw, name_as=NAMES.get(k, ""), **S1)
            for k in (6, 36, 48)]
    out.append(Regime("given S=1% L=0.5%: every layout slowed 7%, sigma 3%, 5 trials", n=5,
                      sd=0.03, slowed=K[48], check=rel, **S1))
    out.append(Regime("given S=0.5% L=0.25%: every layout slowed 7%, sigma 3%, 5 trials",
                      n=5, sd=0.03, slowed=K[48], check=rel, session=0.005, layout=0.0025,
                      given=(0.005, 0.0025)))
    for s, lay in ((0.01, 0.005), (0.01, 0.01), (0.02, 0.005), (0.02, 0.01)):
        out.append(Regime(f"A/A, sessions N(0,{s:.0%}) and N(0,{lay * 100:.2g}%) given, sigma 2%, "
                          "10 trials", session=s, layout=lay, given=(s, lay), check=aa,
                          tuned=(s, lay) in ((0.01, 0.005), (0.02, 0.01))))
    out.append(Regime("A/A, sessions N(0,2%) and N(0,1%), the defaults used (0.5%, 0.1%)",
                      session=0.02, layout=0.01, check=None))
    drift = dict(design="interleaved", drift=0.05, **DEF)
    out += [Regime("paired ABBA (regress run), A/A, 5% drift, sigma 2%, 10 trials",
                   check=aa, **drift),
            Regime("paired ABAB, A/A, 5% drift, sigma 2%, 10 trials", order="ABAB",
                   check=None, **drift),
            Regime("paired ABBA, 6 of 48 slowed 7%, 5% drift, sigma 2%, 10 trials",
                   slowed=K[6], check=pw, **drift)]
    return out


def _one(job):
    r, nights, seed = job
    return r, run_regime(r, nights, seed)


def table(nights: int, seed: int, workers: int = 2) -> list[str]:
    """One row per regime: its rates with 95% Wilson intervals over nights, exit codes."""
    from concurrent.futures import ProcessPoolExecutor

    from rates import rate

    ok, why = frozen()
    rows = ["| regime | S, L used | nights with a flag | slowed layouts confirmed | nights "
            "without a false flag | release flagged | named | exit 0 / 1 / 4 | goal | "
            "tuned on |", "|---|---|---|---|---|---|---|---|---|---|"]
    jobs = [(r, nights, seed + 10_000 * i) for i, r in enumerate(regimes())]
    with ProcessPoolExecutor(workers) as pool:
        for r, t in pool.map(_one, jobs):
            n_slow = len(r.slowed) * t.nights
            hit, clean = t.hits / max(1, n_slow), (t.nights - t.false_nights) / t.nights
            met = {"aa": t.flagged <= 0.05 * t.nights,
                   "power": hit >= 0.8 and clean >= 0.9,
                   "release": t.release >= 0.95 * t.nights}.get(r.check)
            goal = {"aa": "flagged <= 5%", "power": ">= 80% confirmed, >= 90% clean",
                    "release": "release flagged >= 95%"}.get(r.check, "(none)")
            if met is not None:
                goal = f"**{'met' if met else 'NOT met'}**: {goal}"
            named = f"{t.named / t.nights:.0%}" if r.slowed and len(r.slowed) < 48 else "-"
            exits = " / ".join(f"{t.exits.get(c, 0) / t.nights:.0%}" for c in (0, 1, 4))
            given = r.given and f"{r.given[0] * 100:.2g}%, {r.given[1] * 100:.2g}% given"
            used = ("cancel (paired)" if r.design == "interleaved"
                    else given or "0.5%, 0.1% (dgx-h100)")
            rows.append(f"| {r.name} | {used} | {rate(t.flagged, t.nights)} | "
                        f"{rate(t.hits, n_slow) if n_slow else '-'} | "
                        f"{rate(t.nights - t.false_nights, t.nights)} | "
                        f"{rate(t.release, t.nights) if len(r.slowed) == 48 else '-'} | "
                        f"{named} | {exits} | {goal} | "
                        f"{'seeds < 1000' if r.tuned else 'never (held out)'} |")
            print(rows[-1], flush=True)
    head = [f"Rule frozen at `{FROZEN_AT}` ({', '.join(RULE_FILES)}): "
            + ("none changed since: **held out**: the seeds here (from "
               f"{seed:,}) were never run while the rule was built, nor were the regimes "
               "marked 'never'." if ok else f"**NOT held out**: {why}."), ""]
    return head + rows + [""]
