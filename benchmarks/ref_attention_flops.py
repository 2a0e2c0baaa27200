"""How fast is the pure-torch a2a+p2p reference, against torch's own matmul on this machine?

Runs real trials through the local launcher (cp=4, layouts [2,2] and [1,4], fp32, CPU/gloo)
at a few sequence lengths, prints a markdown table and writes it, stamped, to
benchmarks/RESULTS-ref-attention.md (``--out``). FLOPs follow hcp_tune/job/bench.py
(causal forward 4*seq^2*heads*head_dim/2, backward 2.5x, per rank = total/cp), so the rate
is model FLOPs per second per rank. The matmul columns are the ceiling: float32
``torch.matmul`` measured in this process, once with one thread on the shape of one
attention block (QK^T of one chunk pair, batched over heads) and once with all threads on a
large square product. The ranks share the machine's cores (4 ranks on ``os.cpu_count()``
cores: each gets cores/4 of a core), so a rank's ceiling is the one-thread block-shape rate
times min(cores/4, 1).

    python benchmarks/ref_attention_flops.py [--seqs 1024 2048 4096] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hcp_tune.engine.launch import run_local_batch  # noqa: E402
from hcp_tune.space.layout import Layout, rank_groups  # noqa: E402
from hcp_tune.spec import Status, TrialSpec  # noqa: E402

CP = 4
HEADER = """# Performance: the pure-torch reference attention (CPU)

Real trials through the local launcher: cp=4, layouts [2,2] (a2a+p2p) and [1,4] (p2p ring),
8 heads x head_dim 64, fp32, gloo on loopback, 1 warm-up + 3 measured steps, median of the
slowest rank per step. Rate = model FLOPs per rank per second (causal forward
4*seq^2*heads*head_dim/2, backward 2.5x forward, per rank total/cp). The ceiling is float32
`torch.matmul`, best of 20, one thread on one attention block's shape, times the cores a
rank gets. A correctness reference and a CPU stand-in, not a model of GPU speed.

"""
HEADS, HEAD_DIM = 8, 64  # a small but not toy attention layer: hidden 512


def matmul_gflops(shape_a, shape_b, threads: int, repeats: int = 20) -> float:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(*shape_a), torch.randn(*shape_b)
    torch.matmul(a, b)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    flops = 2.0 * a.numel() // a.shape[-1] * a.shape[-1] * b.shape[-1]
    return flops / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--measure", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "RESULTS-ref-attention.md"))
    args = ap.parse_args()
    layouts = [Layout(2, 2), Layout(1, 4)]
    specs = [
        TrialSpec(trial_id=f"bench-s{seq}-{lay.a2a}x{lay.p2p}", a2a=lay.a2a, p2p=lay.p2p, seq=seq,
                  heads=HEADS, kv_heads=HEADS, head_dim=HEAD_DIM, warmup_steps=1,
                  measure_steps=args.measure, time_limit_s=600, comm_timeout_s=300,
                  expected_groups=rank_groups(lay, tp=1, gpus_per_node=8).as_dict())
        for seq in args.seqs for lay in layouts
    ]
    cores = os.cpu_count() or 1

    def ceilings():  # best of 20 runs each; taken before and after the trials (shared machine)
        blocks = {seq: matmul_gflops((HEADS, seq // (2 * CP), HEAD_DIM),
                                     (HEADS, HEAD_DIM, seq // (2 * CP)), threads=1)
                  for seq in args.seqs}
        return blocks, matmul_gflops((2048, 2048), (2048, 2048), threads=cores)

    lines: list[str] = []

    def emit(text: str = "") -> None:
        print(text)
        lines.append(text)

    blocks0, square0 = ceilings()
    with tempfile.TemporaryDirectory() as tmp:
        results = run_local_batch(specs, workdir=tmp)
    blocks1, square1 = ceilings()
    blocks = {seq: max(blocks0[seq], blocks1[seq]) for seq in args.seqs}
    square = max(square0, square1)
    emit(f"machine: {cores} cores; fp32 torch.matmul 2048^2 with {cores} threads: "
          f"{square:.1f} GFLOP/s\n")
    share = cores / CP  # cores per rank
    emit("| seq | layout | median step (s) | GFLOP/s per rank | sum over 4 ranks | "
          f"matmul 1 thread, block shape | per-rank ceiling (x{share:g} core) | per rank / ceiling |")
    emit("|---:|:---:|---:|---:|---:|---:|---:|---:|")
    for spec, res in zip(specs, results):
        block = blocks[spec.seq]
        if res.status != Status.OK:
            emit(f"| {spec.seq} | [{spec.a2a},{spec.p2p}] | {res.status.value}: {res.error} |")
            continue
        per_rank = res.tflops_per_gpu * 1e3
        ceiling = block * min(share, 1.0)
        emit(f"| {spec.seq} | [{spec.a2a},{spec.p2p}] | {res.median_s:.3f} | {per_rank:.2f} | "
              f"{per_rank * CP:.2f} | {block:.1f} | {ceiling:.1f} | {per_rank / ceiling:.0%} |")

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from stamp import write_results

    write_results(args.out, HEADER + "\n".join(lines) + "\n")

if __name__ == "__main__":
    main()
