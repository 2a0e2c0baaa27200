"""Which attention implementation a trial runs on this rank, and the environment it ran in.

``choose_backend``: TE on CUDA (sm80+, bf16/fp16), else the pure-torch reference, with the
reason when the choice differs from the spec's. ``fingerprint``: versions, hosts, GPU,
driver and the communication settings, gathered once per process set.
"""
from __future__ import annotations

import platform
import socket
from dataclasses import dataclass
from typing import Any, Optional

from hcp_tune.job.failures import EnvironmentProblem
from hcp_tune.spec import TrialSpec


def _reference_dtype(spec: TrialSpec) -> str:
    """The torch reference's dtype: fp32 unless backend=torch asks for bf16/fp16 explicitly
    (then it is proven the same-dtype way, as the TE path is: the GPU proof, on gloo)."""
    return spec.dtype if spec.backend == "torch" else "fp32"


@dataclass(frozen=True)
class Backend:
    """The attention implementation a trial runs, where, in which dtype, and why."""

    name: str  # te | torch
    device: Any  # torch.device
    dtype: str  # bf16 | fp16 | fp32
    note: str = ""  # set when the choice differs from what the spec asked for


def choose_backend(spec: TrialSpec, cuda_index: Optional[int]) -> Backend:
    """TE on CUDA (sm80+, TE >= 1.12, bf16/fp16), else the torch reference. Packed
    sequences on TE too old for them (``te.thd_problem``) are refused, not run elsewhere.

    ``cuda_index`` is the GPU this rank is already bound to (``dist.bind_device``), None
    without CUDA. Nothing here may touch a device before that binding.
    """
    import torch

    from hcp_tune.job.attention import te

    if spec.runner != "attention":
        raise EnvironmentProblem(f"runner {spec.runner!r} is not implemented in this job yet")
    if spec.backend not in ("auto", "te", "torch"):
        raise EnvironmentProblem(f"unknown backend {spec.backend!r}: expected auto, te or torch")
    if spec.device == "cuda" and cuda_index is None:
        raise EnvironmentProblem(
            "no CUDA device on this node, but the trial is for a GPU cluster profile "
            "(measure CPU trials with cluster=local)")
    if cuda_index is None:
        if spec.backend == "te":
            raise EnvironmentProblem(f"backend=te requested, but {te.te_unavailable_reason()}")
        return Backend("torch", torch.device("cpu"), _reference_dtype(spec))
    device = torch.device("cuda", cuda_index)
    if spec.backend == "torch":
        return Backend("torch", device, _reference_dtype(spec))
    problem = te.cp_capability_problem(cuda_index)
    if problem:  # the torch reference would measure something no training run can use
        raise EnvironmentProblem(problem)
    reason = te.te_unavailable_reason()
    if reason:
        if spec.backend == "te":
            raise EnvironmentProblem(f"backend=te requested, but {reason}")
        return Backend("torch", device, "fp32",
                       f"backend=auto: {reason}; the pure-torch reference ran instead (fp32)")
    if spec.dtype == "fp32":
        if spec.backend == "te":
            raise EnvironmentProblem("the TE path runs bf16 or fp16, not fp32: set dtype=bf16")
        return Backend("torch", device, "fp32",
                       "backend=auto with dtype=fp32: TE's CP attention runs bf16/fp16 only; "
                       "the pure-torch reference ran instead")
    if spec.packing == "thd":  # refused here, before TE runs: see attention/te.py
        problem = te.thd_problem(te.te_version() or "0", spec.comm_type)
        if problem:
            raise EnvironmentProblem(problem)
    return Backend("te", device, spec.dtype)


def rank_hosts() -> list[str]:
    """Every rank's host name, in rank order (a collective: every rank calls it)."""
    import torch.distributed as dist

    hosts: list = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    return hosts


def fingerprint(env, device, hosts: Optional[list[str]] = None) -> dict:
    """``hosts``: ``rank_hosts()`` when the caller gathered them already (else gathered
    here). ``rank_nodes`` is each rank's node in order of first appearance (host-name free,
    ``bridge.placement.rank_nodes``): the placement, which changes what a layout measures."""
    import importlib.metadata as md

    import torch

    from hcp_tune.job import knobs
    from hcp_tune.job.attention.te import te_version

    def dist_version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    from hcp_tune.job.bridge.placement import rank_nodes

    hosts = rank_hosts() if hosts is None else hosts
    fp = {
        "hosts": sorted(set(hosts)),
        "rank_nodes": rank_nodes(hosts),
        "launcher": env.source,
        "python": platform.python_version(),
        "torch": str(torch.__version__),  # a plain str: TorchVersion would make the
        # orchestrator import torch (3 s) to unpickle a job's results
        "megatron_core": dist_version("megatron-core") or dist_version("megatron_core"),
        "transformer_engine": te_version(),
        "megatron_bridge": dist_version("megatron-bridge") or dist_version("megatron_bridge"),
        "cuda": torch.version.cuda,
        "gpu": None, "driver": None, "nccl": None,
        "settings": knobs.settings(),  # NCCL_*, CUDA_DEVICE_MAX_CONNECTIONS, NVTE_*
        "inject_delay": knobs.injected_delay(),  # a testing aid: never a real measurement
    }
    if device.type == "cuda":
        fp["gpu"] = torch.cuda.get_device_name(device)
        fp["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        try:
            import subprocess

            fp["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10,
            ).stdout.split("\n")[0].strip() or None
        except (OSError, subprocess.SubprocessError):
            pass
    return fp
