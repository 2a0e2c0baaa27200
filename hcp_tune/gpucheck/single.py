"""The GPU check on one GPU (``scripts/gpu_check.sh`` with 1-3 GPUs, or ``--one-gpu``).

What one lent GPU can show, one line each: the device binding a one-GPU-per-task node
gives (``dist.bind_device`` picks index 0 for any local rank, and the Bridge runner tells
Bridge so with ``dist.external_gpu_device_mapping``, ``LOCAL_RANK`` staying the task's);
Transformer Engine's import and the attention backend it selects for the timed shapes
without CP; and, where Megatron-Bridge and TE are installed, a Bridge
run at cp=1 (world 1) with hcp-tune's callbacks: steps timed, memory read, TE's backend
recorded. Then what it could not check, in words: anything needing two GPUs (CP
communication, the HCP groups on NCCL, the CP proof, NCCL across nodes).
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

NOT_CHECKED = ("gpu-check one-gpu: not checked (needs >= 4 GPUs): CP communication, "
               "Megatron-Core's HCP groups on NCCL, the CP-active proof, TFLOP/s of a CP "
               "layout, NCCL across nodes")


def _line(name: str, ok: bool, text: str) -> tuple[bool, str]:
    return ok, f"gpu-check one-gpu {name}: {'PASS' if ok else 'FAIL'}  {text}"


def check_binding() -> tuple[bool, str]:
    """A task at local rank 3: bound to cuda:(3 % visible); Bridge keeps LOCAL_RANK=3 (so
    only local rank 0 compiles Megatron-Core's helpers) and, on a one-GPU-per-task node, is
    told the GPU is 0 through ``dist.external_gpu_device_mapping``."""
    import torch

    from hcp_tune.job.bridge.runner import device_fields, launcher_env
    from hcp_tune.job.dist import DistEnv, bind_device

    index = bind_device(3)
    if index is None:
        return _line("binding", False, "no CUDA device visible to torch")
    env = DistEnv(rank=3, local_rank=3, world_size=4, master_addr="127.0.0.1",
                  master_port=1, source="slurm")
    local = launcher_env(env)["LOCAL_RANK"]
    count = torch.cuda.device_count()
    try:
        told = device_fields(3, index)
    except Exception as e:  # two or three GPUs visible: Bridge cannot be told the index
        return _line("binding", False, f"local rank 3 -> cuda:{index} of {count}: {e}")
    bridge_gpu = 0 if told.get("dist.external_gpu_device_mapping") else int(local)
    ok = index == 3 % count and torch.cuda.current_device() == index and bridge_gpu == index
    return _line("binding", ok, f"local rank 3 -> cuda:{index} of {count} visible, "
                 f"LOCAL_RANK={local}, Bridge sets cuda:{bridge_gpu}"
                 + (" (external_gpu_device_mapping)" if told else ""))


def check_te() -> tuple[bool, str]:
    """TE imports, and selects a backend for bf16 causal attention without CP."""
    from hcp_tune.job.attention.te import TEAttention, te_unavailable_reason, te_version

    reason = te_unavailable_reason()
    if reason:
        return _line("te", False, reason)
    import torch

    att = TEAttention(heads=32, kv_heads=8, head_dim=128, groups=None, comm_type="none")
    q = torch.randn(4096, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(4096, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    att(q, kv, kv)
    torch.cuda.synchronize()
    backend = att.selected_backend
    return _line("te", bool(backend), f"transformer_engine {te_version()}, selected backend: "
                 f"{backend or 'not reported'}")


def check_bridge(cluster: str, workdir: Path) -> tuple[bool, str]:
    """A Bridge run at cp=1 on this GPU, with the callbacks (the sweep's spec builder)."""
    from hcp_tune.job.bridge.runner import missing_stack

    problem = missing_stack()
    if problem:
        return _line("bridge", False, f"not run: {problem}")
    from hcp_tune import config
    from hcp_tune.engine.launch import run_local
    from hcp_tune.engine.trialspec import spec_for
    from hcp_tune.space import plan

    cfg = config.load(["cp=1", "seq=4096", "tp=1", "pp=1", "model=llama3-8b",
                       f"cluster={cluster}", "runner=bridge", "dtype=bf16"])
    cand = plan.candidates(cfg)[0]
    spec = dataclasses.replace(spec_for(cfg, cand, "gpu-check-one-gpu-bridge",
                                        workdir / "progress"),
                               layers=2, warmup_steps=2, measure_steps=3, progress_path=None)
    res = run_local(spec, workdir=workdir / spec.trial_id)
    ok = res.status.value == "ok" and bool(res.step_times_s)
    return _line("bridge", ok, f"cp=1 world 1: {res.status.value}"
                 + (f", median step {res.median_s:.4g} s" if res.median_s else "")
                 + (f", peak memory {res.peak_mem_bytes / 2**30:.1f} GiB" if res.peak_mem_bytes
                    else "")
                 + f", te_backend {res.te_backend or 'not reported'}"
                 + (f" ({res.error})" if res.error else ""))


IN_CHILD = {"binding": check_binding, "te": check_te}


def in_child(name: str) -> tuple[bool, str]:
    """``IN_CHILD[name]`` in a process of its own: its CUDA context (the binding, TE's test
    attention) ends with it, so it neither holds memory on the GPU during the Bridge run
    nor counts in that run's device-memory figures."""
    proc = subprocess.run([sys.executable, "-m", "hcp_tune.gpucheck.single", name],
                          capture_output=True, text=True, timeout=300)
    try:
        ok, line = json.loads(proc.stdout.strip().splitlines()[-1])
        return bool(ok), str(line)
    except (IndexError, ValueError):
        tail = (proc.stderr.strip().splitlines() or [""])[-1][:200]
        return _line(name, False, f"its process ended (exit {proc.returncode}): {tail}")


def run(cluster: str, workdir: Path, *, checks: tuple[Callable[[], tuple[bool, str]], ...] = ()
        ) -> list[tuple[bool, str]]:
    """Every one-GPU check (each failing on its own), then what could not be checked. The
    binding and TE checks run in child processes (``in_child``); this process starts no
    CUDA context."""
    out = []
    for check in checks or (lambda: in_child("binding"), lambda: in_child("te"),
                            lambda: check_bridge(cluster, workdir / "bridge")):
        try:
            out.append(check())
        except Exception as e:  # a check that crashed is a failed check, with its line
            out.append(_line(getattr(check, "__name__", "check"), False,
                             f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
    return out


if __name__ == "__main__":  # one check, in this process: ``in_child``
    try:
        result = IN_CHILD[sys.argv[1]]()
    except Exception as e:  # a crashed check is a failed check, with its line
        result = _line(sys.argv[1], False, f"{type(e).__name__}: {str(e)[:200]}")
    print(json.dumps(list(result)))
