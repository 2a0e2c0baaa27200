"""The error rates of ``regress``'s decision rule, on the design users run: one session per
tag (and the interleaved design of ``regress run``), a nightly matrix of 48 layouts, every
verdict from ``regress.compare`` itself (rows in, verdicts out).

1. **Simulated nights, one row per regime** (``regress_nights.py``: rows shaped as the
   store writes them, trials drawn by the synthetic runner's code, its noise kinds and
   session effects). The issue's goals: k = 6, 12, 24, 36, 48 of 48 layouts slowed 7%
   (sigma 2%, 10 trials) confirmed >= 80% with >= 90% of nights free of a false flag, the
   shared level named; every layout slowed: the release flagged on >= 95% of nights; A/A
   nights (a fixed 3% shift; sessions N(0, S) and N(0, L) with S and L given) flagged on
   <= 5%; paired ABBA runs with a 5% drift flagged on <= 5%; each regime's exit codes.
2. ``regress power``'s trials checked through ``compare`` (within 5 points of its power).
3. ``settle=true`` (looks at 5, 10, 15, 20 and 30 trials, O'Brien-Fleming spending): the
   false-alarm rate over all looks within 1.5x the single look's.
4. **The recorded CPU pool** (``benchmarks/regress_pool_rows.jsonl``: one code version,
   sessions pool-1..4 on the shared 2-core CPU, and bigdelay-1 with a 50 ms ring delay),
   resampled by **session**: every ordered pair of distinct sessions is one A/A night of
   one session per tag (n trials drawn from each), and the same session's trials split
   alternately is the interleaved design; with the local profile's S (42%).
5. **The recorded H200 pool** (``benchmarks/recordings/h200-attention-compute.jsonl``: one
   rank's attention compute for the 4 splits of cp=8 at two sequence lengths, 6 sessions of
   8 interleaved trials): the same A/A design by session pair on 8 layouts of real GPU noise,
   and power with a planted 7% slowdown (2 of 8 layouts, or all of them).

**Held out.** ``regress_nights.FROZEN_AT`` is the commit the rule was frozen at; part 1
says whether a rule file changed since, and calls its figures held out only if none did.
While building the rule only seeds below 1000 and the regimes marked so were run; every
figure here uses seeds from ``--seed`` (default 1,000,000).

    PYTHONPATH=$PWD python benchmarks/regress_error_rates.py [--nights 400]
        [--out benchmarks/RESULTS-regress-error-rates.md]
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from hcp_tune.outputs.regress import Options, compare, stats, usable  # noqa: E402
from hcp_tune.outputs.regress.rows import position  # noqa: E402
from rates import wilson  # noqa: E402
from regress_nights import K, Regime, night_rows, run_regime  # noqa: E402
from regress_nights import table as nights_table  # noqa: E402

POOL = REPO / "benchmarks" / "regress_pool_rows.jsonl"
GPU_POOL = REPO / "benchmarks" / "recordings" / "h200-attention-compute.jsonl"
CLEAN = ("pool-1", "pool-2", "pool-3", "pool-4")
CUDA_MEM = "torch.cuda.max_memory_allocated over the measured steps, max over ranks"
OPTS = Options(baseline="base", candidate="cand")


def trial(tag, seq, cp, a2a, t, median, mem, i):
    return {"cluster": "sim", "model": "m", "tp": 1, "pp": 1, "cp": cp, "seq": seq,
            "runner": "attention", "env_tag": tag, "a2a": a2a, "p2p": cp // a2a,
            "comm_type": "", "median_s": median, "status": "ok", "verified": True,
            "peak_mem_bytes": mem, "mem_note": CUDA_MEM, "trial_id": f"{tag}-t{i:04d}-a{a2a}",
            "fingerprint": {}}


def pct(k, n):
    lo, hi = wilson(k, n)
    return f"{100 * k / n:.1f}% ({100 * lo:.1f}-{100 * hi:.1f})"


def goal(ok: bool) -> str:
    return "**met**" if ok else "**NOT met**"


def simulated(nights: int, seed: int) -> list[str]:
    return ["## 1. Simulated nightly matrix (48 layouts), one row per regime", "",
            f"{nights} nights per row; rates with 95% Wilson intervals over nights (each "
            "night is independent here). 'S, L used': the session spreads the rule was told "
            "(given) or took from the dgx-h100 profile; the truth's sessions are drawn at the "
            "values in the regime's name, else at the profile's. 'named': nights whose "
            "output named the slowed layouts' shared level (a2a=8; a2a > 1), or any name "
            "where none fits. Exit codes: 0 nothing flagged, 1 confirmed, 4 inconclusive.",
            ""] + nights_table(nights, seed)


def power_check(nights: int, seed: int) -> list[str]:
    lines = ["## 2. `regress power` against simulation", "",
             "For each (effect, noise), `regress power layouts=48` gives n (80% power, "
             "threshold 5%, family-wise 0.05; its own simulation of the rule's statistics, "
             "seed 0) and the power it states at n; checked here through `regress.compare` "
             f"(rows in), 6 of 48 layouts changed by the effect, {nights} nights with other "
             "seeds. Goal: within 5 points of the stated power.", "",
             "| effect | noise | n per tag | stated power | simulated power | difference | "
             "goal |", "|---|---|---|---|---|---|---|"]
    for effect, sd in ((0.07, 0.02), (0.10, 0.03), (0.08, 0.05), (-0.10, 0.03)):
        n = stats.trials_for_power(effect, sd, 0.05, 0.05, 98, 48)
        stated = stats.simulated_power(n, effect, sd, 0.05, 0.05, 48)  # what it prints
        t = run_regime(Regime("power", n=n, sd=sd, effect=effect, slowed=K[6],
                              given=(0.0, 0.0)), nights, seed + 7919)
        hit = t.hits / (6 * nights)
        lines.append(f"| {effect:+.0%} | {sd:.0%} | {n} | {stated:.1%} | "
                     f"{pct(t.hits, 6 * nights)} | {100 * (hit - stated):+.1f} "
                     f"points | {goal(abs(hit - stated) <= 0.05)} |")
        print(f"power {effect} {sd}: n={n} stated {stated:.3f} simulated {hit:.3f}", flush=True)
    return lines + [""]


LOOKS = (5, 10, 15, 20, 30)


def sequential(nights: int, seed: int) -> list[str]:
    """A/A nights looked at after 5, 10, 15, 20, 30 trials: single look (plain regress at
    5) vs every look at the full rate (the old settle) vs O'Brien-Fleming spending."""
    single = naive = spent = 0
    aa = Regime("seq", n=LOOKS[-1], sd=0.03, fixed_shift=0.03, session=0.005, layout=0.001)
    for k in range(nights):
        rows = night_rows(aa, seed + 104729 + k)
        flagged_naive = flagged_spent = False
        before = 0.0
        for i, n in enumerate(LOOKS):
            part = [r for r in rows if position(r)[0] < n]
            t = n / LOOKS[-1]
            full = compare(part, OPTS)
            bad = bool(full.flagged or full.shift_flagged)
            if i == 0:
                single += bad
            flagged_naive |= bad
            rep = compare(part, OPTS, alpha=max(stats.look_alpha(t, before), 1e-12))
            flagged_spent |= bool(rep.flagged or rep.shift_flagged)
            before = t
        naive += flagged_naive
        spent += flagged_spent
    print(f"sequential: single {single} naive {naive} spent {spent} of {nights}", flush=True)
    ratio = spent / single if single else float("nan")
    return ["## 3. `settle=true`: false alarms over all looks", "",
            f"A/A nights (shared 3% shift, sigma 3%, 48 layouts), looks at {LOOKS} trials per "
            f"tag, {nights} nights, seeds {seed + 104729}+. Goal: over all looks within 1.5x "
            "the single look's rate.", "",
            "| design | nights with a false alarm |", "|---|---|",
            f"| single look at 5 trials (plain `regress`) | {pct(single, nights)} |",
            f"| every look at the full rate (no spending) | {pct(naive, nights)} |",
            f"| O'Brien-Fleming alpha spending (`settle=true`) | {pct(spent, nights)} |", "",
            f"Spending against the single look: {spent} vs {single} nights"
            + (f" (x{ratio:.2f})" if single else "") + "; goal (within 1.5x, or both "
            f"at or below 1% of nights, less than these nights resolve): "
            f"{goal(spent <= 1.5 * single or max(spent, single) <= 0.01 * nights)}.", ""]


def pool_part(draws: int, seed: int) -> list[str]:
    pool = [json.loads(x) for x in POOL.read_text().splitlines() if x.strip()]
    pool = [r for r in pool if usable(r)]
    rng = random.Random(seed)
    by = {(s, a): sorted((r for r in pool if r["env_tag"] == s and r["a2a"] == a),
                         key=lambda r: r["trial_id"]) for s in CLEAN + ("bigdelay-1",)
          for a in (1, 2)}
    per_pair = {}
    for a in CLEAN:
        for b in CLEAN:
            if a == b:
                continue
            flags = 0
            for _ in range(draws):
                rows = []
                for a2a in (1, 2):
                    rows += [{**r, "env_tag": "base"} for r in rng.sample(by[(a, a2a)], 5)]
                    rows += [{**r, "env_tag": "cand"} for r in rng.sample(by[(b, a2a)], 5)]
                rep = compare(rows, OPTS)
                flags += bool(rep.flagged or rep.shift_flagged)
            per_pair[(a, b)] = flags / draws
    inter = {}
    for s in CLEAN:
        rows = []
        for a2a in (1, 2):
            got = by[(s, a2a)]
            rows += [{**r, "env_tag": "base"} for r in got[0::2]]
            rows += [{**r, "env_tag": "cand"} for r in got[1::2]]
        rep = compare(rows, Options(baseline="base", candidate="cand", design="interleaved"))
        inter[s] = bool(rep.flagged or rep.shift_flagged)
    boot = []
    for _ in range(2000):
        pick = [rng.choice(CLEAN) for _ in CLEAN]
        vals = [per_pair[(x, y)] for x in pick for y in pick if x != y]
        if vals:
            boot.append(sum(vals) / len(vals))
    boot.sort()
    mean = sum(per_pair.values()) / len(per_pair)
    lo, hi = boot[int(0.025 * len(boot))], boot[int(0.975 * len(boot)) - 1]
    big = 0
    for _ in range(draws):
        rows = []
        for a2a in (1, 2):
            rows += [{**r, "env_tag": "base"} for r in rng.sample(
                [r for s in CLEAN for r in by[(s, a2a)]], 5)]
            rows += [{**r, "env_tag": "cand"} for r in rng.sample(by[("bigdelay-1", a2a)], 5)]
        rep = compare(rows, OPTS)
        big += any(c.a2a == 1 and c.verdict == "regression" for c in rep.comparisons)
    sessions = ["| session | layout | trials | median s |", "|---|---|---|---|"]
    for (s, a2a), got in by.items():
        med = statistics.median(r["median_s"] for r in got)
        sessions.append(f"| {s} | [{a2a},{2 // a2a}] | {len(got)} | {med:.4f} |")
    lines = ["## 4. The recorded CPU pool, resampled by session", "",
             "The pool (`benchmarks/regress_pool.py`: `cluster=local model=tiny cp=2 seq=1024 "
             "runner=attention executor=local`, recorded at load averages of 6-23 on the shared "
             "2-core machine), ok and verified trials:", ""] + sessions + ["",
             f"One session per tag: each ordered pair of distinct clean sessions, {draws} draws "
             "of 5 trials per tag and layout (2 layouts: too few to separate a common shift, "
             "so each layout is judged on its whole change). Nights with a confirmed change:",
             "", "| baseline session | candidate session | confirmed change |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {100 * v:.0f}% |" for (a, b), v in per_pair.items()]
    lines += ["", f"Mean over the 12 session pairs: **{100 * mean:.1f}%**, 95% interval from "
              f"resampling the 4 sessions: {100 * lo:.1f}-{100 * hi:.1f}%. The sessions' "
              "medians differ by up to 3x on this loaded shared CPU (the table above): the "
              "local profile's session spread S (42%) was measured on these sessions, and "
              "with it one session per tag and two layouts flags almost no session pair "
              "(before the spread entered the verdict: 57.6%). The price is below: at this "
              "spread no rule can tell a several-fold slowdown from a session. Hence the "
              "interleaved design.", "",
              "Interleaved (each session's trials split alternately into the two tags, "
              "paired, `design=interleaved`): confirmed change in "
              f"{sum(inter.values())} of {len(inter)} sessions "
              "(" + ", ".join(f"{s}: " + ("flagged" if v else "clean")
                              for s, v in inter.items()) + ").",
              "", f"Power on the pool: bigdelay-1's ring layout (a 50 ms delay per transfer) "
              f"against the clean sessions, 5 trials per tag, one session per tag at the "
              f"local profile's S: confirmed in {pct(big, draws)} of draws.", ""]
    print(f"pool: mean {mean:.3f} [{lo:.3f},{hi:.3f}] interleaved {inter} big {big}/{draws}",
          flush=True)
    return lines


def gpu_rows() -> dict[tuple[str, tuple[int, int]], list[dict]]:
    """The H200 recording as regress rows: (session, (seq, a2a)) -> its trials."""
    by: dict = {}
    for line in GPU_POOL.read_text().splitlines():
        r = json.loads(line)
        row = trial("x", r["seq"], r["cp"], r["a2a"], r["trial"], r["median_s"], None, r["trial"])
        by.setdefault((r["session"], (r["seq"], r["a2a"])), []).append(row)
    return by


def gpu_part(draws: int, seed: int) -> list[str]:
    by = gpu_rows()
    sessions = sorted({s for s, _ in by})
    layouts = sorted({k for _, k in by})
    rng = random.Random(seed)

    def night(x, y, slow=(), factor=1.0):
        rows = []
        for k in layouts:
            rows += [{**r, "env_tag": "base"} for r in rng.sample(by[(x, k)], 5)]
            f = factor if k in slow else 1.0
            rows += [{**r, "env_tag": "cand", "median_s": r["median_s"] * f}
                     for r in rng.sample(by[(y, k)], 5)]
        return compare(rows, OPTS)

    pairs = [(x, y) for x in sessions for y in sessions if x != y]
    aa = {p: sum(bool(rep.flagged or rep.shift_flagged) for rep in
                 (night(*p) for _ in range(draws))) for p in pairs}
    hit = false = nights_clean = uni = 0
    for i in range(draws * len(pairs)):
        x, y = pairs[i % len(pairs)]
        slow = rng.sample(layouts, 2)
        rep = night(x, y, slow, 1.07)
        got = {(c.key[5], c.a2a) for c in rep.flagged if c.verdict == "regression"}
        hit += len(got & set(slow))
        false += len(got - set(slow))
        nights_clean += not (got - set(slow))
        rep = night(x, y, layouts, 1.07)
        uni += bool(rep.shift_flagged or rep.flagged)
    n = draws * len(pairs)
    meds = ["| session | " + " | ".join(f"{s}/[{a},{8 // a}]" for s, a in layouts) + " |",
            "|---|" + "---|" * len(layouts)]
    for s in sessions:
        meds.append(f"| {s} | " + " | ".join(
            f"{statistics.median(r['median_s'] for r in by[(s, k)]) * 1e3:.3f}"
            for k in layouts) + " |")
    total = sum(aa.values())
    lines = ["## 5. The recorded H200 pool, resampled by session", "",
             "Real GPU noise: `benchmarks/gpu_recording.py` on one H200 (torch's flash "
             "attention, one CP rank's compute for each split of cp=8 at seq 32768 and 131072; "
             "no communication: see RESULTS-gpu-recording.md), 6 sessions (processes) of 8 "
             "interleaved trials. Session medians in ms, per seq/layout:", ""] + meds + ["",
             f"One session per tag, 8 layouts, 5 trials per tag and layout, {draws} draws per "
             "ordered session pair. A/A nights with a confirmed change:", "",
             "| baseline session | candidate session | confirmed change |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {100 * v / draws:.0f}% |" for (a, b), v in aa.items()]
    lines += ["", f"All pairs: {pct(total, draws * len(pairs))} (the interval treats draws as "
              f"independent; with {len(sessions)} sessions the honest unit is the "
              f"{len(pairs)} pairs above).", "",
              f"Power on the same pool, {n} nights (2 of the 8 layouts of the candidate "
              f"session slowed 7%): slowed layouts confirmed in {pct(hit, 2 * n)}; nights "
              f"without a false flag {pct(nights_clean, n)}. Every layout slowed 7%: "
              f"flagged on {pct(uni, n)} of nights. (8 layouts at 5 trials, not the goal's 48 "
              "at 10; the 32K keys' trials spread 2.6-3.5%: a lone 7% change there is "
              "often left inconclusive at 5 trials.)", ""]
    print(f"gpu: A/A {total}/{draws * len(pairs)} power {hit}/{2 * n} clean {nights_clean}/{n} "
          f"uniform {uni}/{n}", flush=True)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nights", type=int, default=400, help="simulated nights per row")
    ap.add_argument("--draws", type=int, default=100, help="pool draws per session pair")
    ap.add_argument("--seed", type=int, default=1_000_000,
                    help="first seed (development used seeds below 1000)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "RESULTS-regress-error-rates.md"))
    ap.add_argument("--only", choices=("sim", "power", "seq", "pool", "gpu"), default=None)
    args = ap.parse_args()
    t0 = time.monotonic()
    parts = {"sim": lambda: simulated(args.nights, args.seed),
             "power": lambda: power_check(args.nights // 2, args.seed),
             "seq": lambda: sequential(args.nights // 2, args.seed),
             "pool": lambda: pool_part(args.draws, args.seed),
             "gpu": lambda: gpu_part(args.draws, args.seed)}
    body = []
    for name, fn in parts.items():
        if args.only in (None, name):
            body += fn()
    head = ["# `regress`: error rates of the decision rule", "",
            "```", "PYTHONPATH=$PWD python " + " ".join(sys.argv), "```", "",
            "Every verdict is `regress.compare`'s (rows in, verdicts out). The rule: per "
            "night the common shift is the level of the layouts most plausibly unchanged "
            "(the group of layouts at one level most plausible as a pure session shift), "
            "tested against 0 with the session spread S; each layout's deviation from it "
            "with the layout x session spread L; noise pooled across layouts (moderated "
            "variances); Holm's correction over every layout x (time, memory) and the "
            "shifts at **family-wise error rate 0.05**; a verdict only when the estimate is "
            "also beyond the 5% threshold (docs/regress.md). Seeds from "
            f"{args.seed:,}. "
            f"{time.monotonic() - t0:.0f} s.", ""]
    from stamp import write_results

    if args.only is None:
        write_results(args.out, "\n".join(head + body))
        print(f"wrote {args.out}")
    else:
        print("\n".join(body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
