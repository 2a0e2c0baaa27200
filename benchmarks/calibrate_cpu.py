"""Validate the cost model on this machine: measure, calibrate, predict unmeasured lengths.

Measures the attention runner (one attention layer, forward + backward, pure-torch
reference, fp32, gloo) for the tiny model on the local cluster at cp=4 and cp=8, every
legal [a2a, p2p] split, several sequence lengths; fits the cost model on some lengths and
reports the relative error on the lengths left out. Writes the measured rows (JSONL), the
fitted parameters (results/calibration/local__<env_tag>.json) and a Markdown summary.

    python benchmarks/calibrate_cpu.py [--job-root DIR] [--rows FILE] [--out benchmarks/RESULTS-calibration.md]

``--job-root`` is a checkout that has ``hcp_tune.engine.launch`` (the measuring side); it runs in
a subprocess with that checkout first on PYTHONPATH. ``--rows FILE`` skips measuring and
refits rows measured before. About 4-6 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# cp=8 runs 8 gloo ranks on the machine's cores: with 2 cores its long sequences take
# minutes per trial (ranks waiting in collectives compete with ranks computing), so it stops
# at 2048; cp=4 goes to 4096.
SEQS_BY_CP = {4: (512, 1024, 2048, 3072, 4096), 8: (512, 1024, 1536, 2048)}
BATCH_TIMEOUT_S = 240  # per (cp, layout) batch of trials
SPLITS = {  # name: (train seqs, held-out seqs)
    "interpolate": ((512, 1024, 2048, 4096), (1536, 3072)),
    "extrapolate": ((512, 1024, 1536), (2048, 3072, 4096)),
}
ENV_TAG = "cpu-torch-ref"

MEASURE = r'''
import json, sys, time
from pathlib import Path
from hcp_tune.engine.launch import run_local_batch
from hcp_tune.space.layout import Layout, rank_groups
from hcp_tune.spec import TrialSpec, result_from_json
seqs_by_cp, workdir, batch_timeout_s = json.loads(sys.argv[1]), sys.argv[2], float(sys.argv[3])
model, dims = sys.argv[4], json.loads(sys.argv[5])  # dims of conf/model/<model>.yaml, 1 layer
tag = "" if model == "tiny" else f"{model}-"  # tiny keeps the trial ids of earlier runs
for cp, seqs in seqs_by_cp.items():
    cp = int(cp)
    for a in [d for d in range(1, cp + 1) if cp % d == 0 and dims["kv_heads"] % d == 0]:
        layout, folder = Layout(a, cp // a), Path(workdir) / f"cp{cp}"  # one batch per layout
        specs = [TrialSpec(
            trial_id=f"{tag}cp{cp}-{a}x{cp // a}-s{seq}", a2a=a, p2p=cp // a, tp=1, seq=seq,
            dtype="fp32", backend="torch", warmup_steps=1, measure_steps=5,
            expected_groups=rank_groups(layout, tp=1, gpus_per_node=8).as_dict(), **dims)
            for seq in seqs]
        done = {}
        for spec in specs:  # reuse a result measured by an earlier run of this script
            f = folder / f"{spec.trial_id}.result.json"
            if f.is_file():
                res = result_from_json(f.read_text())
                if res.status.value == "ok":
                    done[spec.trial_id] = res
        todo = [s for s in specs if s.trial_id not in done]
        t0 = time.time()
        if todo:
            for spec, res in zip(todo, run_local_batch(todo, workdir=folder, timeout_s=batch_timeout_s)):
                done[spec.trial_id] = res
        for spec in specs:
            res = done[spec.trial_id]
            print(json.dumps({"cluster": "local", "model": model, **dims, "tp": 1, "cp": cp,
                              "a2a": spec.a2a, "p2p": spec.p2p, "seq": spec.seq, "mbs": 1,
                              "dtype": "fp32", "runner": "attention", "status": res.status.value,
                              "median_s": res.median_s, "p10_s": res.p10_s, "p90_s": res.p90_s,
                              "error": res.error}), flush=True)
        print(f"# cp={cp} [{a},{cp // a}]: {len(todo)} measured, {len(specs) - len(todo)} reused, "
              f"{time.time() - t0:.0f} s", file=sys.stderr, flush=True)
'''


TINY = {"tiny": dict(heads=8, kv_heads=8, head_dim=8, hidden=64, layers=1, vocab=1024),
        "tiny-gqa": dict(heads=8, kv_heads=2, head_dim=8, hidden=64, layers=1, vocab=1024)}
# conf/model/tiny*.yaml with one layer (the attention runner times one attention layer)


def measure(job_root: Path, workdir: Path, seqs_by_cp=SEQS_BY_CP, model: str = "tiny") -> list[dict]:
    """Every split the model's KV heads allow, per cp and seq, in a subprocess on job_root."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(job_root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(seqs_by_cp), str(workdir),
                           str(BATCH_TIMEOUT_S), model, json.dumps(TINY[model])], env=env,
                          cwd=job_root, stdout=subprocess.PIPE, text=True, timeout=1500)
    if proc.returncode:
        raise SystemExit(f"measuring failed (exit {proc.returncode}); see the lines above")
    return [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]


def table(rep) -> str:
    lines = ["| cp | [a2a,p2p] | seq | measured ms | predicted ms | error |", "|---|---|---|---|---|---|"]
    for r in sorted(rep.per_row, key=lambda r: (r["seq"], r["cp"], r["a2a"])):
        lines.append(f"| {r['cp']} | [{r['a2a']},{r['p2p']}] | {r['seq']} | {r['measured_s'] * 1e3:.1f} "
                     f"| {r['predicted_s'] * 1e3:.1f} | {r['rel_error']:+.1%} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job-root", default=str(REPO), help="checkout with hcp_tune.engine.launch")
    ap.add_argument("--rows", help="refit these measured rows (JSONL) instead of measuring")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "RESULTS-calibration.md"))
    ap.add_argument("--results-dir", default=str(REPO / "results"))
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from hcp_tune.costmodel import calibrate

    t0 = time.time()
    if args.rows:
        rows = calibrate.read_rows(args.rows)
    else:
        rows = measure(Path(args.job_root), Path(args.results_dir) / "calibrate_cpu_trials")
        rows_path = REPO / "benchmarks" / "calibrate_cpu_rows.jsonl"
        rows_path.write_text("".join(json.dumps({**r, "env_tag": ENV_TAG}) + "\n" for r in rows))
    measure_s = time.time() - t0
    how = (f"refit from `{args.rows}` (measured earlier)" if args.rows
           else f"in {measure_s:.0f} s")
    ok = [{**r, "env_tag": ENV_TAG} for r in rows if r["status"] == "ok" and r["median_s"]]
    bad = [r for r in rows if r not in ok and r["status"] != "ok"]
    out = ["# Cost model calibration on this machine (CPU, attention runner)\n",
           f"Measured {len(rows)} trials ({len(ok)} ok) on {platform.processor() or platform.machine()}, "
           f"{os.cpu_count()} cores, {how}: tiny model (8 heads, head_dim 8), "
           f"fp32, pure-torch a2a+p2p reference over gloo, every split, "
           f"seq by cp {SEQS_BY_CP}; median of 5 timed steps after 1 warm-up. "
           f"Produced by `python benchmarks/calibrate_cpu.py` (rows in "
           f"`benchmarks/calibrate_cpu_rows.jsonl`; refit with `--rows`).\n"]
    if bad:
        out.append(f"Not ok and left out: {[(r['cp'], r['a2a'], r['seq'], r['status']) for r in bad]}\n")
    uncal = calibrate.fit_report(ok, calibrate.CostParams())
    out.append(f"Uncalibrated defaults (nominal 10 GFLOP/s/core): rms relative error "
               f"{uncal.rms_rel_error:.1%}, max {uncal.max_rel_error:.1%} over all {uncal.n} rows.\n")
    for name, (train, test) in SPLITS.items():
        _, _, plain = calibrate.holdout_error(ok, train, test, n_starts=6, robust_scale=None)
        params, tr, te = calibrate.holdout_error(ok, train, test, n_starts=6)
        fitted = ", ".join(f"{n}={getattr(params, n):.4g}" for n in tr.fitted)
        out.append(f"## Split `{name}`: fit on seq {list(train)}, held out seq {list(test)}\n")
        out.append(f"- fitted ({tr.n} rows): {fitted}")
        out.append(f"- fit error: rms {tr.rms_rel_error:.1%}, max {tr.max_rel_error:.1%}")
        out.append(f"- **held-out error ({te.n} rows): rms {te.rms_rel_error:.1%}, "
                   f"max {te.max_rel_error:.1%}**")
        out.append(f"- the same fit by plain least squares instead of the robust soft-L1 "
                   f"loss: held-out rms {plain.rms_rel_error:.1%}, max {plain.max_rel_error:.1%}\n")
        out.append(table(te) + "\n")
    params, rep = calibrate.fit(ok, n_starts=6)
    path = calibrate.save_params(args.results_dir, "local", ENV_TAG, params, rep)
    out.append(f"## All rows\n\nFit on all {rep.n} rows: rms {rep.rms_rel_error:.1%}, max "
               f"{rep.max_rel_error:.1%}; stored as `{Path(path).relative_to(REPO) if Path(path).is_relative_to(REPO) else path}` "
               f"(used by `predict cluster=local env_tag={ENV_TAG}`).\n")
    sys.path.insert(0, str(REPO / "benchmarks"))
    from stamp import write_results

    write_results(args.out, "\n".join(out))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
