"""The false-alarm rate and the power of ``regress``'s verdicts, measured by resampling a
pool of recorded CPU trials (``benchmarks/regress_pool_rows.jsonl``, recorded by
``benchmarks/regress_pool.py``: one code version, sessions pool-1..4, and delay-1..2 with
an injected ring delay).

Each resample draws ``n`` trials per tag (without replacement: the two tags never share a
trial) and asks ``regress.compare_layout`` for the verdict, as ``regress`` would on two
sweeps of ``search.repeats=n``:

- **A/A, pooled**: both tags drawn from all clean trials of the layout (exchangeable).
- **A/A, across sessions**: the four clean sessions split at random two against two, each
  tag drawn from its half: what two sweeps at different times see (the machine's load
  drifts between sessions; this is issue 23's scenario).
- **x1.10 / x1.20 / x1.50**: across sessions, the candidate's per-trial medians multiplied
  by the factor (a known slowdown of exactly that size).
- **delay 5 ms / 50 ms**: the baseline from the clean sessions, the candidate from
  delay-1..2 (``HCP_TUNE_INJECT_DELAY=p2p:0.005``) or bigdelay-1 (``p2p:0.05``): the
  delay slows the ring layout [1,2] only; [2,1] under it is one more A/A across sessions.

A false alarm is a confirmed REGRESSION or UNEXPECTED IMPROVEMENT in an A/A scenario; power
is the share of confirmed REGRESSIONs under a known slowdown. Rates carry a 95% Wilson
interval over the resamples.

    PYTHONPATH=$PWD python benchmarks/regress_error_rates.py [--resamples 300]
        [--out benchmarks/RESULTS-regress-error-rates.md]

About 8 minutes on the shared 2-core machine (each verdict bootstraps 2000 resamples).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hcp_tune.noise import noise, percentile  # noqa: E402
from hcp_tune.outputs import regress  # noqa: E402
from hcp_tune.outputs.regress_verdict import verdict  # noqa: E402

POOL = REPO / "benchmarks" / "regress_pool_rows.jsonl"
CLEAN = ("pool-1", "pool-2", "pool-3", "pool-4")
DELAYED = {"delay 5 ms": ("delay-1", "delay-2"), "delay 50 ms": ("bigdelay-1",)}
NS = (3, 5, 10)
FACTORS = (1.10, 1.20, 1.50)
# (name, threshold, noise floor in the bound); the first is the default. Every variant
# judges the same draws with the same 95% interval (the interval does not depend on the
# bound), so their rates differ by the rule alone.
# (bound = max(10%, noise floor) is left out: on this CPU the noise floor is nearly always
# above 10%; an earlier run counted the same verdicts as the default in all cells but one.)
VARIANTS = (
    ("default: bound = max(5%, noise floor), confirmed only on >= 5 trials per tag", 0.05, True),
    ("bound = max(5%, noise floor), confirmed on 3 trials (confirm_trials=3)", 0.05, True),
    ("bound = 5% (noise_floor=false confirm_trials=3)", 0.05, False),
    ("bound = 10% (threshold=0.1 noise_floor=false confirm_trials=3)", 0.10, False),
)


def wilson(k: int, n: int) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    z, p = 1.96, k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def scaled(rows: list[dict], factor: float) -> list[dict]:
    return [{**r, "median_s": r["median_s"] * factor} for r in rows]


def draw(rng: random.Random, scenario: str, n: int, clean: dict[str, list[dict]],
         delayed: dict[str, list[dict]]) -> tuple[list[dict], list[dict]]:
    """(baseline rows, candidate rows) of one resample."""
    if scenario == "A/A pooled":
        both = rng.sample([r for s in CLEAN for r in clean[s]], 2 * n)
        return both[:n], both[n:]
    halves = list(CLEAN)
    rng.shuffle(halves)
    a = [r for s in halves[:2] for r in clean[s]]
    b = [r for s in halves[2:] for r in clean[s]]
    if scenario in delayed:
        return rng.sample(a + b, n), rng.sample(delayed[scenario], n)
    base, cand = rng.sample(a, n), rng.sample(b, n)
    if scenario.startswith("x"):
        cand = scaled(cand, float(scenario[1:]))
    return base, cand


def run_cell(scenario, n, a2a, pool, resamples, seed) -> list[dict[str, int]]:
    """Verdict counts per variant over ``resamples`` draws."""
    clean = {s: [r for r in pool if r["env_tag"] == s and r["a2a"] == a2a] for s in CLEAN}
    delayed = {name: [r for r in pool if r["env_tag"] in tags and r["a2a"] == a2a]
               for name, tags in DELAYED.items()}
    rng = random.Random(seed)
    opts = regress.Options(baseline="a", candidate="b")  # the defaults
    counts = [{"regression": 0, "improvement": 0, "inconclusive": 0, "ok": 0}
              for _ in VARIANTS]
    for _ in range(resamples):
        base, cand = draw(rng, scenario, n, clean, delayed)
        key = regress.row_key(base[0])
        c = regress.compare_layout(key, [{**r, "env_tag": "a"} for r in base],
                                   [{**r, "env_tag": "b"} for r in cand], opts)
        for i, (_, threshold, floor) in enumerate(VARIANTS):
            said = (c.verdict if i == 0 else
                    verdict(c.ci[0], c.ci[1], max(threshold, c.noise_floor) if floor
                            else threshold))
            counts[i][said] += 1
    return counts


def pool_lines(pool: list[dict]) -> list[str]:
    out = ["| session | layout | trials | median s | noise (p10-p90 half-width) |",
           "|---|---|---|---|---|"]
    for tag in CLEAN + tuple(t for tags in DELAYED.values() for t in tags):
        for a2a in (1, 2):
            vals = [r["median_s"] for r in pool if r["env_tag"] == tag and r["a2a"] == a2a]
            if vals:
                out.append(f"| {tag} | [{a2a},{2 // a2a}] | {len(vals)} | "
                           f"{percentile(vals, 50):.4f} | {noise(vals) * 100:.1f}% |")
    for a2a in (1, 2):
        vals = [r["median_s"] for r in pool if r["env_tag"] in CLEAN and r["a2a"] == a2a]
        out.append(f"| pool-1..4 | [{a2a},{2 // a2a}] | {len(vals)} | "
                   f"{percentile(vals, 50):.4f} | {noise(vals) * 100:.1f}% |")
    return out


def pct(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{100 * k / n:.1f}% ({100 * lo:.1f}-{100 * hi:.1f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--resamples", type=int, default=300, help="draws per cell")
    ap.add_argument("--pool", default=str(POOL), help="the recorded rows (JSONL)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "RESULTS-regress-error-rates.md"))
    args = ap.parse_args()
    pool = [json.loads(x) for x in Path(args.pool).read_text().splitlines() if x.strip()]
    pool = [r for r in pool if regress.usable(r)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=REPO).stdout.strip()
    load0, t0 = os.getloadavg()[0], time.monotonic()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    scenarios = (["A/A pooled", "A/A across sessions"] + [f"x{f:.2f}" for f in FACTORS]
                 + list(DELAYED))
    cells = {}
    for scenario in scenarios:
        for a2a in (1, 2):
            for n in NS:
                cells[(scenario, a2a, n)] = run_cell(scenario, n, a2a, pool, args.resamples,
                                                     seed=1000 * n + a2a)
            print(f"{scenario} [{a2a}] done, {time.monotonic() - t0:.0f} s", flush=True)
    sections = []
    for vi, (name, _, _) in enumerate(VARIANTS):
        lines = [f"### {name}", "", "| scenario | layout | n/tag | regression | improvement "
                 "| inconclusive | ok | false alarm or power |",
                 "|---|---|---|---|---|---|---|---|"]
        for (scenario, a2a, n), per in cells.items():
            c = per[vi]
            aa = scenario.startswith("A/A") or (scenario in DELAYED and a2a == 2)
            hit = c["regression"] + c["improvement"] if aa else c["regression"]
            what = "false alarm" if aa else "power"
            lines.append(f"| {scenario} | [{a2a},{2 // a2a}] | {n} | {c['regression']} | "
                         f"{c['improvement']} | {c['inconclusive']} | {c['ok']} | {what} "
                         f"{pct(hit, args.resamples)} |")
        sections += lines + [""]
    head = [
        "# `regress`: false-alarm rate and power, measured on recorded CPU trials", "",
        "```", f"PYTHONPATH=$PWD python benchmarks/regress_error_rates.py --resamples "
        f"{args.resamples}", "```", "",
        f"Run on {started} at commit {commit}, {platform.machine()} {platform.system()}, "
        f"{os.cpu_count()} cores shared with other engineers; load average {load0:.1f} at "
        f"start, {os.getloadavg()[0]:.1f} at the end; {time.monotonic() - t0:.0f} s. The pool "
        "(recorded by `benchmarks/regress_pool.py`, committed as "
        "`benchmarks/regress_pool_rows.jsonl`): `cluster=local model=tiny cp=2 seq=1024 "
        "runner=attention executor=local`, 2 warm-up + 5 measured steps, "
        "`executor.trials_per_job=8`; ok, verified trials:", ""] + pool_lines(pool) + [
        "", "Scenarios: see the script's docstring. `n/tag` is `search.repeats`; the "
        "comparison is `regress.compare_layout` itself (2000 bootstrap resamples, seed 0, "
        f"95% interval). {args.resamples} draws per cell; each cell counts the confirmed "
        "regressions / unexpected improvements / inconclusive / ok, and the rate that "
        "matters (false alarm on an A/A, power on a slowdown) with its 95% Wilson interval. "
        "Every variant judges the same draws with the same interval; only the bound differs.",
        ""]
    sys.path.insert(0, str(REPO / "benchmarks"))
    from stamp import write_results  # the stamp: command, date, commit, machine, load

    write_results(args.out, "\n".join(head + sections))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
