"""The typed configuration groups: the top-level keys, ``runner``, ``search`` and
``executor`` (``cluster`` and ``model`` live in cluster.py / model.py).

Each is a frozen dataclass built by ``schema.from_mapping`` when the config is loaded, so a
bad value stops every command at once with one line (exit 2). Fields backed by a key in
``conf/`` have no Python default: the YAML is where the default is written, once. What each
field allows is in its annotation and metadata, which the README's Configuration section
mirrors. No third-party imports: dispatch, sweep and the CLI read these as attributes.
"""
from __future__ import annotations

import re
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

from hcp_tune.config.schema import from_mapping, valid_keys
from hcp_tune.errors import ConfigError
from hcp_tune.spec import FailureClass

# Sizes every command accepts (issue 8, 4.6): beyond them nothing real exists, and the
# enumeration and rank groups stay instant. The world (tp*cp*dp) is bounded as well.
CP_MAX = 1024  # largest CP split; Megatron-Bridge's published runs use up to 32-64
TP_MAX = 64  # TP stays inside an NVLink domain (72 GPUs on GB200 NVL72)
DP_MAX = 1024  # data-parallel replicas measured in one trial
PP_MAX = 512  # pipeline stages; Llama 3 405B recipes use 8-16, nothing real uses hundreds
GBS_MAX = 2 ** 24  # sequences per global batch
SEQ_MAX = 2 ** 24  # 16,777,216 tokens, past the longest published CP runs (~10M)
MBS_MAX = 1024
ENV_TAG_RE = re.compile(r"[A-Za-z0-9._-]+")  # a new env_tag; stored ones are read as they are
WORLD_MAX = 16384  # tp*cp*dp*pp GPUs planned (plan lists every rank group: stays ~1 s)

Runner = Literal["auto", "attention", "model", "bridge", "attention+bridge", "synthetic"]
RUNNERS: tuple[str, ...] = typing.get_args(Runner)
ExecutorName = Literal["slurm", "local", "auto"]
BatchMode = Literal["processes", "steps", "auto"]
AUTO_TRIALS_PER_JOB_MAX = 32  # trials_per_job=auto: a crashed batch sends back at most this many
EXECUTOR_NAMES: tuple[str, ...] = typing.get_args(ExecutorName)
# search.retry: none, every failure, or one label: a failure class or "invalid"
RETRY_CHOICES = ("none", "failed", *(c.value for c in FailureClass), "invalid")


def _f(doc: str, **meta: Any) -> Any:
    """A required field (its default is in conf/) with its doc and limits."""
    return field(metadata={"doc": doc, **meta})


@dataclass(frozen=True, kw_only=True)
class TopLevel:
    """``conf/config.yaml``'s own keys, as the user types them."""

    cp: int = _f("context-parallel size to split", max=CP_MAX)
    seq: tuple[int, ...] = _f("sequence length(s)", max=SEQ_MAX)
    tp: Optional[tuple[int, ...]] = _f(
        "tensor-parallel size(s); null: the Bridge recipe's for the model and seq", max=TP_MAX)
    pp: Optional[int] = _f("pipeline-parallel stages; null: the Bridge recipe's", max=PP_MAX)
    dp: int = _f("data-parallel replicas in a trial", max=DP_MAX)
    mbs: int = _f("micro-batch size", max=MBS_MAX)
    gbs: Optional[int] = _f("global batch size in sequences; null: mbs*dp (one micro-batch "
                            "per step)", max=GBS_MAX)
    recompute: Literal["none", "selective", "full"] = _f(
        "activation recompute granularity, as Bridge's model.recompute_granularity")
    recompute_method: Literal["uniform", "block"] = _f(
        "recompute=full: Bridge's model.recompute_method")
    recompute_num_layers: Optional[int] = _f(
        "recompute=full: Bridge's model.recompute_num_layers; null: 1 (uniform) or every "
        "layer of a stage (block)", max=1024)
    dtype: Literal["bf16", "fp16", "fp32"] = _f("attention dtype")
    drop_cross_node_a2a: bool = _f("reject layouts whose a2a level leaves a node")
    format: Literal["table", "json"] = _f("output format")
    results_dir: str = _f("where sweeps store results")
    env_tag: str = _f("name of the software stack measured")

    def __post_init__(self) -> None:
        # env_tag is a name: it becomes part of file names (regress pages, calibration
        # files), so no path separators, no '..', nothing two tags could share once slugged
        if not ENV_TAG_RE.fullmatch(self.env_tag) or set(self.env_tag) <= {"."}:
            raise ConfigError(
                f"env_tag={self.env_tag!r}: expected a name of letters, digits, '.', '_' and "
                "'-' (e.g. env_tag=te-2.10)")
        tp, pp = max(self.tp or (1,)), self.pp or 1
        world = tp * self.cp * self.dp * pp
        if world > WORLD_MAX:
            raise ConfigError(
                f"tp*cp*dp*pp = {tp}*{self.cp}*{self.dp}*{pp} = {world} GPUs: expected at "
                f"most {WORLD_MAX}")
        if self.gbs is not None and self.gbs % (self.mbs * self.dp):
            raise ConfigError(
                f"gbs={self.gbs}: must be a multiple of mbs*dp = {self.mbs}*{self.dp} = "
                f"{self.mbs * self.dp} (Megatron's micro-batch calculator asserts it); "
                f"e.g. gbs={self.mbs * self.dp * max(1, self.gbs // (self.mbs * self.dp))}")


@dataclass(frozen=True, kw_only=True)
class RunnerConfig:
    """``runner=``: what a trial measures, and how long."""

    name: Runner = _f("auto | attention | model | bridge | attention+bridge | synthetic")
    backend: Literal["auto", "te", "torch"] = _f("attention backend on the job side")
    qkv_format: Literal["sbhd", "bshd"] = _f("TE's q/k/v layout (sbhd: what Megatron-Core trains with)")
    warmup_steps: int = _f("discarded steps before timing", min=0, max=1000)
    measure_steps: int = _f("timed steps; the median is ranked", max=1_000_000)
    time_limit_s: float = _f("per trial, seconds")
    recipe: Optional[str] = _f("runner=bridge: a Bridge recipe function to start from; "
                               "null: a GPT built from the model profile's dimensions")
    overrides: list[str] = _f("runner=bridge: Bridge KEY=VALUE overrides, applied last")
    top_k: int = _f("runner=attention+bridge: the attention stage's best layouts Bridge "
                    "measures", max=64)
    truth: Optional[str] = _f("runner=synthetic: the truth file (JSON or YAML) its trials "
                              "are drawn from (hcp_tune/engine/synthetic.py)")
    seed: int = _f("runner=synthetic: the seed of every draw", min=0, max=2 ** 31)

    def __post_init__(self) -> None:
        from hcp_tune.job.bridge.config import BridgeConfigError, parse_overrides

        try:
            parse_overrides(list(self.overrides))
        except BridgeConfigError as e:
            raise ConfigError(str(e)) from None


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """``data.*``: one document a sequence (packing=off) or documents packed (THD)."""

    packing: Literal["off", "thd"] = _f("off | thd (documents packed into seq tokens)")
    lengths: Optional[str] = _f("packing=thd: the document-length mix, a file or a preset "
                                "(hcp_tune/packing.py)")

    def __post_init__(self) -> None:
        if self.packing == "thd" and not self.lengths:
            raise ConfigError("data.packing=thd needs the document lengths: data.lengths=FILE "
                              "(CSV length,count) or a preset, e.g. data.lengths=web")
        if self.packing == "off" and self.lengths:
            raise ConfigError(f"data.lengths={self.lengths!r} is given but data.packing=off: "
                              "expected data.packing=thd with it (or drop data.lengths)")

    @classmethod
    def from_mapping(cls, data: Any) -> "DataConfig":
        data = dict(data or {})
        if data.get("packing") is False:  # YAML 1.1 reads a bare off as false
            data["packing"] = "off"
        return from_mapping(cls, data, "data")


REPEATS_MAX = 100  # the most trials one sweep gives a layout (search.repeats)


@dataclass(frozen=True, kw_only=True)
class SearchConfig:
    """``search=``: which layouts a sweep measures, how often, and when it stops one."""

    repeats: int = _f("trials per layout; with search.adaptive, the most any layout gets",
                      max=REPEATS_MAX)
    min_repeats: int = _f("search.adaptive: trials every kept layout gets before the "
                          "undecided ones get more", max=REPEATS_MAX)
    adaptive: bool = _f("measure only the layouts not yet separated from the best again, "
                        "until the key is settled or a tie (false: every layout "
                        "search.repeats times)")
    tie_threshold: float = _f("a tie: the leaders' ratio interval inside 1 +- this",
                              min=0.0, expect="a number in 0..0.5, e.g. 0.02 (2%)")
    early_stop: bool = _f("stop a trial clearly slower than the best so far")
    order_by_prediction: bool = _f("measure in the cost model's predicted order")
    skip_predicted_slower_than: Optional[float] = _f(
        "skip layouts predicted more than this factor slower than the best", min=1.0,
        expect="a number >= 1 (e.g. 1.5 skips layouts predicted 50% slower than the best)")
    storage: Optional[str] = _f(
        "optuna storage URL or journal file (one storage for every key); null: one "
        "journal per sweep key under <results_dir>/journals/")
    budget_gpu_hours: Optional[float] = _f(
        "stop submitting once the estimate of what was submitted would pass this many "
        "GPU-hours (rank-hours on a CPU profile)", expect="a number of GPU-hours > 0")
    a2a_sizes: Optional[tuple[int, ...]] = _f(
        "measure only the layouts with these a2a sizes (p2p = cp/a2a); null: every kept layout",
        max=CP_MAX)
    retry: Union[str, list[str]] = field(default="none", metadata={
        "doc": "stored failures to measure again", "choices": RETRY_CHOICES})
    allow_predicted_oom: bool = _f(
        "runner=bridge: queue a key even when every layout of it is predicted not to fit the "
        "GPU memory (false: such a key is refused with the change that would fit; each of its "
        "trials would run its whole start-up, then fail as oom)")
    purpose: Literal["tune", "regress"] = field(default="tune", metadata={
        "doc": "tune: find the fastest layout | regress: measurements for `regress` (never "
               "early-stops, never adaptive: a pruned trial is not a measurement, and every "
               "layout gets search.repeats trials)"})

    def __post_init__(self) -> None:
        if self.purpose == "regress":  # every trial of a regress sweep is measured in full,
            # and every layout gets search.repeats of them: regress compares layouts at
            # equal trials, whatever a ranking would have settled
            object.__setattr__(self, "early_stop", False)
            object.__setattr__(self, "adaptive", False)
        if self.tie_threshold > 0.5:
            raise ConfigError(f"search.tie_threshold={self.tie_threshold}: expected a number "
                              "in 0..0.5, e.g. 0.02 (2%)")
        if self.adaptive and self.min_repeats > self.repeats:
            raise ConfigError(
                f"search.min_repeats={self.min_repeats} is above search.repeats="
                f"{self.repeats}: expected min_repeats <= repeats (repeats is the most any "
                f"layout gets), e.g. search.repeats={self.min_repeats}")


@dataclass(kw_only=True, frozen=True)
class ExecutorConfig:
    """``executor=``: where and how trial jobs run (keys and defaults: conf/executor/slurm.yaml)."""

    name: ExecutorName = _f("slurm | local | auto (slurm when sbatch is on PATH)")
    partition: Optional[str] = _f("null: the cluster's default partition")
    account: Optional[str] = _f("SLURM account")
    qos: Optional[str] = _f("SLURM QOS")
    time_limit_min: int = _f("wall-clock limit of one trial job, minutes",
                             expect="an integer number of minutes >= 1")
    gpus_per_node: Optional[int] = _f("null: the cluster profile's count; 0: request none", min=0)
    cpus_per_task: Optional[int] = _f("null: the partition's default")
    mem_gb: Optional[float] = _f("null: the partition's default", expect="a number of GiB > 0")
    exclusive: bool = _f("whole nodes only: no other job shares the links a trial measures")
    array_parallelism: int = _f("most trials of one array running at once")
    trials_per_job: Union[int, Literal["auto"]] = _f(
        "trials one job runs (in one process set, or as steps of one allocation); 1: every "
        "trial its own job; auto: a world size's queued trials spread evenly over the free "
        f"slots, at most {AUTO_TRIALS_PER_JOB_MAX} per job", max=10000)
    batch: BatchMode = _f(
        "how a job runs its trials: processes (one process set for all, as trials_per_job "
        "says) | steps (each trial in fresh processes, srun job steps of one allocation) | "
        "auto (steps for runner=bridge, processes otherwise)")
    keep_allocation: bool = _f(
        "keep a job's allocation for the sweep's next batches of its world size (an "
        "adaptive round, a broken batch's unrun trials), each in fresh processes, instead "
        "of a new job per batch; never for search.purpose=regress")
    extra_sbatch: dict[str, Any] = _f(
        "more #SBATCH flags; they win over the above",
        expect="a mapping of sbatch flag names to scalar values, e.g. {reservation: bench}")
    extra_srun: list[str] = _f("more arguments to the srun that starts the tasks")
    container_image: Optional[str] = _f("pyxis: srun --container-image")
    container_mounts: list[str] = _f("pyxis: srun --container-mounts entries src:dst")
    setup: list[str] = _f("shell lines run before the tasks start")
    python: Optional[str] = _f("python in the job (needs submitit); null: this interpreter")
    folder: Optional[str] = _f("job folders; null: <results_dir>/jobs (must be shared)")

    @classmethod
    def valid_keys(cls) -> list[str]:
        return valid_keys(cls)

    @classmethod
    def from_mapping(cls, data: Any) -> "ExecutorConfig":
        """Build from the ``executor`` group (unknown keys are named with the valid ones)."""
        return from_mapping(cls, data, "executor")
