"""Does packing change the best split? At equal ``seq``, one fixed-length key and two packed
mixes on this CPU (the ``local`` profile), each swept as a user types it and ranked with its
verdict (issue 37, part 7).

Every sweep is the real command (``python -m hcp_tune sweep ... runner=attention
executor=local``, the adaptive default): real gloo trials of the pure-torch reference, the
numerics proof (per document on the packed keys), the same ranking and verdict users get.
The figures and verdicts below are read back from the results folder with the code the
sweep ranks with (``engine.verdict``), not recomputed another way.

    python benchmarks/packed_study.py [--seq 2048] [--cp 4] [--mixes sft lognormal:128:0.5]
        [--extra runner.warmup_steps=1 runner.measure_steps=3] [--results-dir DIR]
        [--out benchmarks/RESULTS-packed-study.md]

About 10 minutes on 2 cores at the defaults. A sweep that was already stored in
``--results-dir`` resumes instead of measuring again.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def sweep(args: argparse.Namespace, mix: str | None) -> tuple[int, float]:
    """Run one key's sweep as a user types it; (exit code, wall seconds)."""
    data = ["data.packing=thd", f"data.lengths={mix}"] if mix else []
    cmd = [sys.executable, "-m", "hcp_tune", "sweep", f"cp={args.cp}", f"seq={args.seq}",
           "tp=1", "pp=1", "model=tiny", "cluster=local", "runner=attention",
           "executor=local", f"results_dir={args.results_dir}", *args.extra, *data]
    t0 = time.monotonic()
    print("$", " ".join(cmd[1:]), flush=True)
    r = subprocess.run(cmd, cwd=REPO, text=True, capture_output=True)
    print(r.stdout[-1500:], r.stderr[-800:], sep="\n", flush=True)
    return r.returncode, time.monotonic() - t0


def key_report(store, cfg_args: list[str]) -> dict:
    """The key's rows, figures and verdict, as the sweep ranked them."""
    from hcp_tune import config, packing
    from hcp_tune.stats import verdict
    from hcp_tune.engine.sweep_plan import key_at

    cfg = config.load(cfg_args)
    key = key_at(cfg, 1, cfg.seqs[0])
    rows = store.key_rows(key)
    mix = cfg.mix_at(cfg.seqs[0])
    return {"key": key, "rows": rows, "verdict": verdict.decide(rows),
            "summary": packing.summarise(mix, cfg.seqs[0], cfg.cp).line() if mix else ""}


def layout_table(rep: dict) -> list[str]:
    v = rep["verdict"]
    out = ["| layout | ok trials | figure (median of trial medians) | 95% interval | "
           "ratio to the best (interval) |", "|---|---|---|---|---|"]
    for f in v.figures:
        a, p = f.layout
        ci = (f"{f.ci_lo_s * 1e3:.1f}-{f.ci_hi_s * 1e3:.1f} ms"
              if f.ci_lo_s is not None and f.ci_hi_s is not None else "-")
        r = v.ratios.get(f.layout)
        ratio = f"{r[0]:.3f}-{r[1]:.3f}" if r else ("best" if f is v.figures[0] else "-")
        pruned = " (stopped early)" if f.layout in v.pruned else ""
        out.append(f"| [{a},{p}]{pruned} | {f.n_trials} | {f.median_s * 1e3:.1f} ms | {ci} | "
                   f"{ratio} |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--cp", type=int, default=4)
    ap.add_argument("--mixes", nargs="+", default=["sft", "lognormal:128:0.5"])
    ap.add_argument("--results-dir", default="/tmp/hcp-packed-study")
    ap.add_argument("--extra", nargs="*", default=[],
                    help="overrides every sweep gets, e.g. runner.measure_steps=3")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "RESULTS-packed-study.md"))
    args = ap.parse_args()
    from hcp_tune.engine.error_rates import AGREEMENT, SETTLED_ERROR
    from hcp_tune.store.folder import ResultStore
    from hcp_tune.stats.verdict import summary

    runs = {}
    for mix in [None, *args.mixes]:
        runs[mix] = sweep(args, mix)
    store = ResultStore(Path(args.results_dir))
    base = [f"cp={args.cp}", f"seq={args.seq}", "tp=1", "pp=1", "model=tiny",
            "cluster=local", "runner=attention", f"results_dir={args.results_dir}", *args.extra]
    reps = {mix: key_report(store, base + (["data.packing=thd", f"data.lengths={mix}"]
                                           if mix else [])) for mix in runs}
    out = [f"# Packed sequences vs fixed length: cp={args.cp}, seq={args.seq}, tiny, this CPU\n",
           "Each key swept as a user types it (`python -m hcp_tune sweep cp=... seq=... model=tiny "
           "cluster=local runner=attention executor=local [data.packing=thd data.lengths=MIX]`, "
           f"the adaptive default; with {' '.join(args.extra) or 'no other override'}): real gloo trials of the pure-torch reference attention "
           "(fp32, one layer forward + backward), every trial's numerics proven (per document "
           "on the packed keys) before it is ranked. Figures and verdicts are the sweep's own "
           f"(`engine.verdict`). Verdict error rates as every verdict states them: settled "
           f"{SETTLED_ERROR}; tie {AGREEMENT}. Produced by `python benchmarks/packed_study.py`.\n"]
    fixed_best = reps[None]["verdict"].best.layout if reps[None]["verdict"].best else None
    for mix, rep in reps.items():
        code, wall = runs[mix]
        v = rep["verdict"]
        name = "fixed length (one document a sequence)" if mix is None else \
            f"packed, mix `{rep['key'].mix}`"
        out.append(f"## {name}\n")
        if rep["summary"]:
            out.append(f"Mix at seq={args.seq}, cp={args.cp}: {rep['summary']}.\n")
        out.append(f"Sweep exit {code}, {wall:.0f} s wall, {len(rep['rows'])} trial rows.\n")
        out += layout_table(rep)
        out.append(f"\nVerdict: {summary(v)}.\n")
    out.append("## Does the best split change?\n")
    for mix in args.mixes:
        v, f = reps[mix]["verdict"], reps[None]["verdict"]
        if v.best is None or fixed_best is None:
            out.append(f"- `{mix}`: not measured well enough to say.")
            continue
        best = v.best.layout
        same = best == fixed_best
        sure = {v.kind, f.kind} <= {"settled"}
        what = "the same split" if same else "a different split"
        doubt = ("that they agree" if same else "the change")
        out.append(
            f"- `{mix}`: best [{best[0]},{best[1]}] ({v.kind}) against fixed length's "
            f"[{fixed_best[0]},{fixed_best[1]}] ({f.kind}): {what}"
            + ("" if sure else f"; at least one of the two keys is not settled, so {doubt} "
               "is not established at the stated error rate (its verdict names the trials "
               "that would settle it)") + ".")
    out.append("\nOn 2 CPU cores the ranks share cores and gloo's loopback links: these "
               "numbers say how the ranking moves with the mix on this machine, not what a GPU "
               "cluster's links give. The same command on a GPU cluster profile measures that.")
    from stamp import write_results

    write_results(args.out, "\n".join(out) + "\n")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
