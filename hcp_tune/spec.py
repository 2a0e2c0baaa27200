"""The contract across the orchestrator/job boundary: ``TrialSpec`` in, ``TrialResult`` out.

Standard library only: both sides import this module (the job side inside the training
container, the orchestrator on a login node). Both records round-trip through JSON so a
result can be read back from a job's folder after the orchestrator was restarted.
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import IO, Any, Iterator, Optional

TE_MIN_HCP = (1, 12)  # Transformer Engine 1.12.0: first with a2a+p2p (Megatron-Core asserts it)


def comm_type_of(a2a: int, p2p: int) -> str:
    """The CP comm type that runs ``[a2a, p2p]``: the endpoints are the p2p / a2a baselines."""
    if a2a * p2p == 1:
        return "none"
    return "p2p" if a2a == 1 else "a2a" if p2p == 1 else "a2a+p2p"


class Status(str, enum.Enum):
    OK = "ok"
    FAILED = "failed"  # with a FailureClass
    INVALID = "invalid"  # ran, but did not prove CP was active, or beat physics
    PRUNED = "pruned"  # stopped early: clearly slower than the best so far
    SKIPPED = "skipped"  # not run (predicted too slow, on request)
    CANCELLED = "cancelled"  # the user interrupted the sweep


class FailureClass(str, enum.Enum):
    OOM = "oom"
    COMM = "comm"  # communication timeout or a peer lost
    NUMERICS = "numerics"  # output differs from full attention
    ENVIRONMENT = "environment"  # missing/too old TE or Megatron-Core, no CUDA, ...
    CONFIG = "config"  # the training framework refused the configuration (Bridge's checks)
    TIME_LIMIT = "time_limit"
    UNKNOWN = "unknown"


# Faults a test may plant in a trial (the checks must catch each). Never a config key: the
# orchestrator reads them from FAULT_ENV, ``<fault>`` or ``<fault>@<seq>`` (only trials of
# that sequence length), as HCP_TUNE_INJECT_DELAY is read by the job.
FAULTS = (None, "cp_off", "no_groups", "raise", "kill_rank", "hang_rank")
FAULT_ENV = "HCP_TUNE_INJECT_FAULT"


def fault_from_env(seq: int, environ: Optional[dict] = None) -> Optional[str]:
    """The fault FAULT_ENV plants in a trial of length ``seq``, or None (unset or empty).
    A malformed value raises ValueError with the form expected."""
    value = (os.environ if environ is None else environ).get(FAULT_ENV, "").strip()
    if not value:
        return None
    fault, _, at = value.partition("@")
    if fault not in FAULTS[1:] or (at and not at.isdigit()):
        raise ValueError(
            f"{FAULT_ENV}={value!r}: expected <fault>[@<seq>] with a fault among "
            f"{', '.join(FAULTS[1:])} (a testing aid; unset it for real measurements)")
    return fault if not at or int(at) == seq else None


@dataclass(kw_only=True)
class TrialSpec:
    """What one trial runs: one layout, once, on one allocation."""

    trial_id: str
    a2a: int
    p2p: int
    tp: int = 1
    # data-parallel replicas and pipeline stages the job runs: the world is tp*cp*dp*pp.
    # Every replica's CP groups run at once (as in training, so shared links are measured);
    # the attention runner measures one pipeline stage (pp stays 1 there)
    dp: int = 1
    pp: int = 1
    vp: Optional[int] = None  # virtual pipeline stages per rank (runner=bridge), None: off
    seq: int
    mbs: int = 1
    # micro-batches per step per data-parallel rank (runner=bridge): the step's global batch
    # is mbs*dp*micro_batches; 0 = one (the attention runner times one micro-batch)
    micro_batches: int = 0
    dtype: str = "bf16"  # bf16 | fp16 | fp32 (the CPU reference runs fp32)
    # packed sequences (data.packing=thd, hcp_tune/packing.py): "thd", and each of the mbs
    # sequences' document lengths (unpadded, in stream order; the job pads each to 2*cp);
    # "off" with one document a sequence. mix: the length mix's label (name#hash)
    packing: str = "off"
    packed_docs: list[list[int]] = field(default_factory=list)
    mix: str = ""
    # model dimensions the workload needs
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int = 0
    ffn_hidden: int = 0
    layers: int = 1
    vocab: int = 0
    runner: str = "attention"  # attention | bridge
    backend: str = "auto"  # auto | te | torch (attention runner only)
    # the q/k/v layout TE is timed in: sbhd is what Megatron-Core's TEDotProductAttention
    # runs in training; bshd the alternative. The torch reference always runs bshd.
    qkv_format: str = "sbhd"
    warmup_steps: int = 2  # discarded: allocator, NCCL communicator and kernel warm-up
    measure_steps: int = 5
    seed: int = 1234
    time_limit_s: float = 600.0
    comm_timeout_s: float = 120.0  # process-group timeout: a dead rank ends the trial
    verify_seq: int = 0  # sequence length of the CP-active proof; 0 = choose (small)
    expected_groups: dict[str, list[list[int]]] = field(default_factory=dict)
    peak_tflops: Optional[float] = None  # hardware ceiling: a faster measurement is invalid
    device: str = "any"  # cuda: the cluster profile promises GPUs, a node without is an error
    progress_path: Optional[str] = None  # per-step progress lines for early stopping
    # where rank 0 writes this trial's TrialResult the moment it ends (rank r > 0 beside it,
    # ``.rank<r>``): the orchestrator polls it, so a batch's trials land one by one
    result_path: Optional[str] = None
    # the orchestrator creates this file to stop the trial (early stop, Ctrl-C); the job
    # checks it before every step and ends the trial PRUNED with the steps it has, its
    # text (the reason) becoming the result's error
    stop_path: Optional[str] = None
    env_tag: str = "default"
    # runner=bridge only: a Bridge recipe function to start from (None: build the model from
    # the dimensions above) and Bridge KEY=VALUE overrides applied last (job/bridge_config.py)
    bridge_recipe: Optional[str] = None
    bridge_overrides: list[str] = field(default_factory=list)
    # tests only: cp_off (no CP communication: each rank attends to its own chunks) |
    # no_groups (HCP groups never created) | raise | kill_rank (last rank exits mid-trial) |
    # hang_rank (last rank stops answering mid-trial: only the comm timeout ends the others)
    inject_fault: Optional[str] = None

    @property
    def cp(self) -> int:
        return self.a2a * self.p2p

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def global_batch(self) -> int:
        """Sequences per step: mbs * dp * micro-batches."""
        return self.mbs * self.dp * max(1, self.micro_batches)

    @property
    def comm_type(self) -> str:
        return comm_type_of(self.a2a, self.p2p)


@dataclass(kw_only=True)
class TrialResult:
    """What came back from one trial; failures are results too."""

    trial_id: str
    status: Status
    failure_class: Optional[FailureClass] = None
    error: Optional[str] = None  # the first meaningful error line
    step_times_s: list[float] = field(default_factory=list)
    median_s: Optional[float] = None
    p10_s: Optional[float] = None
    p90_s: Optional[float] = None
    peak_mem_bytes: Optional[int] = None
    mem_note: str = ""  # what peak_mem_bytes measures on this device
    tflops_per_gpu: Optional[float] = None
    flops_per_gpu_step: Optional[float] = None  # model FLOPs per GPU per step (job/bench.py)
    verification: dict[str, Any] = field(default_factory=dict)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    backend: str = ""
    # the kernel TE selected for the timed shapes, from its debug log ("FusedAttention
    # (sub-backend 1)", "FlashAttention (2.7.4)", ...); "" on the torch reference
    te_backend: str = ""
    qkv_format: str = ""  # the layout the attention ran in (sbhd | bshd)
    notes: list[str] = field(default_factory=list)  # e.g. why another backend ran than asked
    # what the job saw of its own resources (open file descriptors, live process groups)
    resources: dict[str, Any] = field(default_factory=dict)
    world_size: int = 0
    log_path: Optional[str] = None
    job_id: Optional[str] = None
    wall_s: Optional[float] = None  # the whole trial on rank 0: start-up, groups, proof, timing
    # rank 0's seconds per phase of this trial: groups (built, or 0 when reused), proof (0
    # when this layout was proven earlier in the same processes), warmup, measure, and
    # start (imports, world group: only the first trial of a process set pays it)
    phases_s: dict[str, float] = field(default_factory=dict)


def _to_dict(obj: Any) -> dict[str, Any]:
    out = dataclasses.asdict(obj)
    for k, v in out.items():
        if isinstance(v, enum.Enum):
            out[k] = v.value
    return out


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
    data = dict(data)
    if cls is TrialResult:
        data["status"] = Status(data["status"])
        if data.get("failure_class") is not None:
            data["failure_class"] = FailureClass(data["failure_class"])
    return cls(**data)


def to_json(obj: TrialSpec | TrialResult) -> str:
    return json.dumps(_to_dict(obj), sort_keys=True)


def spec_from_json(text: str) -> TrialSpec:
    return _from_dict(TrialSpec, json.loads(text))


def result_from_json(text: str) -> TrialResult:
    return _from_dict(TrialResult, json.loads(text))


def current_umask() -> int:
    """The process's umask, read without changing it where Linux tells it (a sweep's
    threads may create files meanwhile); elsewhere set and restored at once."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w") -> Iterator[IO]:
    """A file to write that replaces ``path`` only when the block ends without an error
    (flushed and fsynced first), so readers see the old file or the new one, never half;
    on an error the partial file is removed. ``mode``: "w" or "wb". The file gets the mode
    ``open`` would give it (0666 less the umask: 0644 under umask 022, so teammates on a
    shared file system can read results), not mkstemp's private 0600."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old file or the new one, never half."""
    with atomic_open(path) as f:
        f.write(text)


# ---------------------------------------------------------------- failure text
# Both sides classify failures from text: the job from an exception, the launcher from a
# rank's log when that rank died before writing its result.

_OOM_MARKERS = ("out of memory", "outofmemoryerror", "memoryerror", "cannot allocate memory")
_COMM_MARKERS = (
    "connection closed", "connection reset", "connection refused", "broken pipe",
    "timed out", "timeout", "distbackenderror", "distnetworkerror", "nccl error",
    "ncclremoteerror", "ncclsystemerror", "peer", "gloo", "socket", "watchdog",
)
_ENV_MARKERS = (
    "modulenotfounderror", "importerror", "no cuda", "cuda is not available",
    "found no nvidia driver", "transformer_engine", "older than",
    # Megatron-Core's TE version asserts ("Transformer-Engine v1.11.0 must be >= 1.12.0 to
    # support hierarchical cp commucation", "Only Transformer-Engine version >= 1.0.0 ...")
    "transformer-engine",
)
# Megatron-Bridge v0.6.0 (51885cf132b2) ConfigContainer.validate and initialize.py, and
# Megatron-Core's TransformerConfig: a configuration the framework refuses
_CONFIG_MARKERS = (
    "sequence length must be divisible by 2 * context parallel size",
    "hierarchical_context_parallel_sizes must be set",
    "product of hierarchical_context_parallel_sizes",
    "must be divisible by the cp/sp collate padding multiple",
    "is not divisible by total_model_size",
    "decentralized process groups (use_decentralized_pg=true) do not support",
    "must be a multiple of tensor_model_parallel_size",
    "is not a configcontainer section", "in this bridge's configcontainer",
)


_SOURCE_LOCATION = re.compile(r"\[[^\]\s]+\.(?:cc|cpp|h|hpp|cu):\d+\]\s*")


def first_error_line(text: str, limit: int = 300) -> str:
    """The first meaningful line of an error: no traceback frames, no blank lines, no C++
    source locations (``[.../pair.cc:537]``)."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    for ln in lines:
        if ln.startswith(("Traceback", "File ", "^", "~")):
            continue
        return _SOURCE_LOCATION.sub("", ln)[:limit]
    return (lines[0] if lines else "unknown error")[:limit]


def classify_error_text(text: str) -> FailureClass:
    low = str(text).lower()
    if any(m in low for m in _OOM_MARKERS):
        return FailureClass.OOM
    if "time limit" in low:
        return FailureClass.TIME_LIMIT
    if any(m in low for m in _CONFIG_MARKERS):
        return FailureClass.CONFIG
    if any(m in low for m in _ENV_MARKERS):
        return FailureClass.ENVIRONMENT
    if any(m in low for m in _COMM_MARKERS):
        return FailureClass.COMM
    return FailureClass.UNKNOWN
