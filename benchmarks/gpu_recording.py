"""Record real GPU step-time distributions for the statistics' replay benchmarks.

What it measures, and what it does not: on ONE GPU, the attention compute that one CP rank
runs for each ``[a2a, p2p]`` split of ``cp``, forward and backward, with torch's
``scaled_dot_product_attention`` (the flash kernel on Hopper). After the all-to-all of an
``a``-group a rank holds ``S/p`` tokens of ``H/a`` query heads (``KV/a`` key/value heads);
the ring then runs ``p`` steps: the causal diagonal block, then ``p-1`` blocks against a
half chunk (the load-balanced causal ring skips the other half). No communication is
measured: one GPU has no CP links. So the figures are *the compute part of each layout*,
not a layout's step time, and they are labelled that way wherever they are used.

What it is for: the noise the sweep's ranking (``decision_cost.py``) and ``regress``
(``regress_error_rates.py``) must live with, read off a real GPU instead of a CPU box:
steps within a trial, trials within a session, and sessions (separate processes, so a new
CUDA context, new allocations, re-warmed clocks). Trials of the layouts are interleaved
(ABCD ABCD ...), as a sweep's batched jobs run them.

Needs torch with CUDA only (runs on a lent GPU that has neither hcp_tune's orchestrator
dependencies nor Transformer Engine):

    python benchmarks/gpu_recording.py --out DIR [--sessions 3] [--trials 8]

writes ``DIR/gpu-recording.jsonl`` (one row per trial: session, seq, layout, per-step
times) and prints a summary.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3-8B's attention, TP=1
CP = 8


def splits(cp: int) -> list[tuple[int, int]]:
    """Every [a, p] with a*p == cp whose a divides the KV heads (the a2a level's rule)."""
    return [(a, cp // a) for a in range(1, cp + 1)
            if cp % a == 0 and KV_HEADS % a == 0]


def rank_step(torch, seq: int, a: int, p: int):
    """A closure running one rank's forward+backward attention for split [a, p]."""
    import torch.nn.functional as F

    local = seq // p          # tokens a rank holds after the a2a level
    half = local // 2
    h, kv = HEADS // a, KV_HEADS // a
    dev, dt = "cuda", torch.bfloat16

    def t(n, heads):
        return torch.randn(1, heads, n, HEAD_DIM, device=dev, dtype=dt, requires_grad=True)

    q, k, v = t(local, h), t(local, kv), t(local, kv)
    kh, vh = t(half, kv), t(half, kv)

    def step():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        loss = out.float().sum()
        for _ in range(p - 1):  # the ring's off-diagonal steps, against half a chunk
            loss = loss + F.scaled_dot_product_attention(q, kh, vh, enable_gqa=True).float().sum()
        loss.backward()

    return step


def session(seqs: list[int], trials: int, warmup: int, steps: int, tag: str) -> list[dict]:
    import torch

    rows = []
    layouts = {seq: {ap: rank_step(torch, seq, *ap) for ap in splits(CP)} for seq in seqs}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for seq in seqs:
        for trial in range(trials):
            for (a, p), fn in layouts[seq].items():  # interleaved: ABCD ABCD ...
                for _ in range(warmup):
                    fn()
                torch.cuda.synchronize()
                times = []
                for _ in range(steps):
                    start.record()
                    fn()
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end) / 1e3)
                rows.append({"session": tag, "seq": seq, "cp": CP, "a2a": a, "p2p": p,
                             "trial": trial, "step_times_s": times,
                             "median_s": statistics.median(times)})
    return rows


def summary(rows: list[dict]) -> str:
    out = ["| seq | [a2a,p2p] | trials | median of trial medians (s) | within-trial CV | "
           "between-trial CV | session medians (s) |", "|---|---|---|---|---|---|---|"]
    keys = sorted({(r["seq"], r["a2a"], r["p2p"]) for r in rows})
    for seq, a, p in keys:
        sel = [r for r in rows if (r["seq"], r["a2a"], r["p2p"]) == (seq, a, p)]
        meds = [r["median_s"] for r in sel]
        within = statistics.median(statistics.pstdev(r["step_times_s"])
                                   / statistics.mean(r["step_times_s"]) for r in sel)
        between = statistics.pstdev(meds) / statistics.mean(meds)
        sess = sorted({r["session"] for r in sel})
        per = ", ".join(f"{statistics.median(r['median_s'] for r in sel if r['session'] == s):.4g}"
                        for s in sess)
        out.append(f"| {seq} | [{a},{p}] | {len(sel)} | {statistics.median(meds):.4g} | "
                   f"{within:.2%} | {between:.2%} | {per} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seq", type=int, nargs="+", default=[32768, 131072])
    ap.add_argument("--prefix", default="s", help="session tag prefix (a machine's runs apart)")
    ap.add_argument("--one-session", help=argparse.SUPPRESS)  # the child process's tag
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu-recording.jsonl"
    if args.one_session:
        rows = session(args.seq, args.trials, args.warmup, args.steps, args.one_session)
        with path.open("a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        return 0
    import torch

    print(f"gpu-recording: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"cuda {torch.version.cuda}; cp={CP}, splits {splits(CP)}, seq {args.seq}, "
          f"{args.sessions} session(s) x {args.trials} trial(s) x {args.steps} step(s)",
          flush=True)
    path.unlink(missing_ok=True)
    for s in range(args.sessions):  # each session a process of its own: a new CUDA context
        t0 = time.monotonic()
        subprocess.run([sys.executable, __file__, "--out", str(out), "--one-session",
                        f"{args.prefix}{s + 1}", "--trials", str(args.trials), "--warmup",
                        str(args.warmup), "--steps", str(args.steps), "--seq",
                        *map(str, args.seq)], check=True, env=os.environ)
        print(f"gpu-recording: session {args.prefix}{s + 1} done in {time.monotonic() - t0:.0f} s",
              flush=True)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
