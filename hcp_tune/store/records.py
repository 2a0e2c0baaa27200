"""Typed records from the job's result to the tables: a trial row, a recommendation, and the
verification evidence a row's ``verified`` is judged from. Standard library only.

Each record carries a schema version. ``from_dict`` reads its own version and older ones
(missing fields take their defaults) and refuses a newer one with ``ResultsTooNew``, whose
message says what to do. ``to_dict`` is the flat dict the tables and every reader use; a
trial row's extra fields (a skipped layout's ``predicted_step_s``) follow its columns.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from hcp_tune.errors import HcpError

KEY_FIELDS = ("cluster", "model", "tp", "pp", "cp", "seq", "runner", "env_tag", "dp", "mbs",
              "micro_batches", "mix")
# Key fields that joined the key later, and what a row or recommendation stored before then
# reads as: the one place an older record's missing key field gets its value. dp: before
# issue 19 every trial ran one replica (dp > 1 came back invalid); mbs: older rows did not
# store it and read as 1 (a sweep run with mbs > 1 before then reads as mbs=1);
# micro_batches: the attention runner times one micro-batch, the Bridge runner ran one;
# mix: packed sequences' length mix (hcp_tune/packing.py), "" for one document a sequence.
OLDER_ROW_DEFAULTS: dict[str, Any] = {"pp": 1, "dp": 1, "mbs": 1, "micro_batches": 1,
                                      "mix": ""}
# Rows written before the version existed have none and read as version 1.
ROW_SCHEMA = 1
# a row file under rows/<slug>/, not the .tmp-* of a write a kill left unrenamed (atomic_open)
ROW_FILES = "[!.]*.json"
RECOMMENDATION_SCHEMA = 2  # 2: median_s is the layout's figure; its interval, verdict
VERIFICATION_SCHEMA = 1


class ResultsTooNew(HcpError):
    """The results folder holds records of a newer schema than this version reads."""


def _check_version(d: dict[str, Any], newest: int, what: str, where: str) -> int:
    version = d.get("schema_version", 1)
    if not isinstance(version, int) or isinstance(version, bool):
        version = 1  # a CSV cell read back as float or null: written by this version or older
    if version > newest:
        raise ResultsTooNew(
            f"{where + ': ' if where else ''}{what} schema {version} > {newest}, the newest "
            "this hcp-tune reads: it was written by a newer hcp-tune; upgrade hcp-tune, or "
            "use another results_dir")
    return version


def key_field(record: dict[str, Any], name: str) -> Any:
    """A key field of a stored row or recommendation; a field the record predates (absent,
    None, or an empty CSV cell read back as NaN) reads as its ``OLDER_ROW_DEFAULTS`` value."""
    value = record.get(name)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return OLDER_ROW_DEFAULTS.get(name)
    return value


def key_args(record: dict[str, Any]) -> list[str]:
    """A key's fields as the ``sweep`` overrides that select it, in KEY_FIELDS order: a
    field at its ``OLDER_ROW_DEFAULTS`` value left out, the micro-batches per step given as
    the global batch (gbs = micro_batches * mbs * dp), a packed key's mix as the data.*
    overrides that name it; env_tag is the caller's to add."""
    got = {k: key_field(record, k) for k in KEY_FIELDS}
    args = [f"{k}={v}" for k, v in got.items() if k not in ("env_tag", "micro_batches", "mix")
            and v != OLDER_ROW_DEFAULTS.get(k)]
    if got["mix"]:  # name#hash: the name is the preset or the lengths file's name
        args += ["data.packing=thd", f"data.lengths={str(got['mix']).rsplit('#', 1)[0]}"]
    if (got["micro_batches"] or 1) != 1:
        args.append(f"gbs={got['micro_batches'] * (got['mbs'] or 1) * (got['dp'] or 1)}")
    return args


def name_slug(name: str) -> str:
    """The short name of a sweep key (from its name): its row folder and its journal."""
    return hashlib.sha1(name.encode()).hexdigest()[:12]


@functools.cache
def _names(cls: type) -> tuple[str, ...]:
    """A record's field names but ``extra``, in order (``dataclasses.fields`` per row cost a
    third of reading a folder's rows)."""
    return tuple(f.name for f in fields(cls) if f.name != "extra")


def _split(cls: type, d: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    names = frozenset(_names(cls))
    return ({k: v for k, v in d.items() if k in names},
            {k: v for k, v in d.items() if k not in names})


@dataclass(frozen=True, kw_only=True)
class TrialRow:
    """One finished (or skipped) trial: its key, layout, status and measured statistics.
    The field order is the order of trials.csv's columns."""

    cluster: str
    model: str
    tp: int
    pp: int = 1  # rows stored before pp joined the key have none (OLDER_ROW_DEFAULTS)
    cp: int
    seq: int
    runner: str
    env_tag: str
    dp: int = 1  # data-parallel replicas (OLDER_ROW_DEFAULTS, as the next two)
    mbs: int = 1  # micro-batch size
    micro_batches: int = 1  # micro-batches per step per replica the user trains with (m)
    mix: str = ""  # packed sequences: the length mix's label (name#hash); "": fixed length
    trial_id: str
    a2a: int
    p2p: int
    comm_type: str = ""
    status: str
    failure_class: str = ""
    error: str = ""
    median_s: Optional[float] = None
    p10_s: Optional[float] = None
    p90_s: Optional[float] = None
    steps: int = 0
    step_times_s: str = "[]"  # JSON list of seconds, one per measured step
    peak_mem_bytes: Optional[int] = None
    tflops_per_gpu: Optional[float] = None
    wall_s: Optional[float] = None
    mem_note: str = ""
    backend: str = ""
    te_backend: str = ""  # the kernel TE selected ("" on the torch reference)
    qkv_format: str = ""
    notes: str = ""
    verified: bool = False
    fingerprint: str = "{}"  # JSON object: versions, GPU, driver, hosts
    job_id: str = ""
    log_path: str = ""
    # rank 0's seconds per phase (start, groups, proof, warmup, measure)
    phases_s: str = "{}"
    # runner=bridge: the micro-batch counts the trial ran, a JSON list ("[2, 4, 6]": m = pp,
    # 2*pp and 3*pp, costmodel.microbatch.measure_points; "[512]" when the user's m itself was
    # measured); the key's micro_batches is the user's m. None on the attention runner and
    # on rows stored before; a row stored with one integer reads as a list of it
    measured_micro_batches: Optional[str] = None
    point_medians_s: Optional[str] = None  # JSON list: the median step at each of those m
    # the fit step = fixed_s + per_micro_batch_s * m through the points (None with one)
    fixed_s: Optional[float] = None
    per_micro_batch_s: Optional[float] = None
    # the step at the user's m: the fit's value there, or the median measured at that m
    # (median_s is the same number: what the study, the ranking and "vs best" read)
    step_at_user_m_s: Optional[float] = None
    # the fit's standard error at the user's m (the points' noise carried through the
    # extrapolation; p10_s/p90_s include it) and its worst residual with that residual's
    # standard deviation from the noise alone (a residual beyond 3 of them: invalid)
    fit_se_s: Optional[float] = None
    fit_residual_s: Optional[float] = None
    fit_residual_sd_s: Optional[float] = None
    schema_version: int = ROW_SCHEMA
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in _names(type(self))}
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "") -> "TrialRow":
        """Raises ``ResultsTooNew`` for a newer row, ``TypeError`` when a key field, the
        trial id, the layout or the status is missing (not a row)."""
        _check_version(d, ROW_SCHEMA, "row", where)
        known, extra = _split(cls, d)
        known.update({k: key_field(known, k) for k in OLDER_ROW_DEFAULTS})
        known["measured_micro_batches"] = measured_list_text(known.get("measured_micro_batches"))
        return cls(**{**known, "schema_version": ROW_SCHEMA}, extra=extra)

    @property
    def text(self) -> str:
        """The row as stored: one JSON object (the row file and the study hold the same)."""
        return row_text(self.to_dict())


def measured_list_text(value: Any) -> Optional[str]:
    """A row's ``measured_micro_batches`` as stored now (a JSON list), from what any version
    stored: a list's text, one integer (rows of one measured m), or nothing (None, NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, (int, float)):
        return json.dumps([int(value)])
    if isinstance(value, (list, tuple)):
        return json.dumps([int(v) for v in value])
    return str(value)


def row_text(row: dict[str, Any]) -> str:
    return json.dumps(row, default=str)


TRIAL_COLUMNS = tuple(f.name for f in fields(TrialRow) if f.name != "extra")


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """Per sweep key, the best layout and what it beat. The field order is the order of
    recommendations.csv's columns."""

    cluster: str
    model: str
    tp: int
    pp: int = 1  # tables written before pp joined the key have none
    cp: int
    seq: int
    runner: str
    env_tag: str
    dp: int = 1
    mbs: int = 1
    micro_batches: int = 1
    mix: str = ""
    a2a: int
    p2p: int
    comm_type: str
    # the best layout's figure (engine/verdict.py): the median of its verified ok trials'
    # medians, its 95% interval over those trials (verdict.py) (empty with one trial) and
    # their count. Schema 1 files held the fastest trial's median here and read with no
    # interval and n_trials 0 (unknown).
    median_s: float
    ci_lo_s: Optional[float] = None
    ci_hi_s: Optional[float] = None
    n_trials: int = 0
    # settled | tie | unsettled (engine/verdict.py); "" in a schema 1 file
    verdict: str = ""
    peak_mem_bytes: Optional[int] = None
    runner_up: str = ""  # "[a2a,p2p]" of the second fastest layout
    runner_up_median_s: Optional[float] = None  # its figure
    ratio_ci_lo: Optional[float] = None  # the 95% interval of runner-up figure / best's
    ratio_ci_hi: Optional[float] = None
    margin: Optional[float] = None  # runner-up figure / best figure - 1
    tie: bool = False  # verdict == "tie" (schema 1: the margin within one trial's noise)
    # tie: the tied layouts ("[2,2] [4,1]") and the one of them with the least peak memory
    tied: str = ""
    lighter: str = ""
    # unsettled: the layouts still to measure and how many more trials each needs
    undecided: str = ""
    more_trials: Optional[int] = None
    speedup_vs_p2p: Optional[float] = None
    speedup_vs_a2a: Optional[float] = None
    trials: int = 0
    ok_trials: int = 0
    incomplete: bool = False
    missing: str = ""  # "[2,2] cancelled; ..."
    # the layouts on the study's (step time, peak memory) Pareto front: "[1,4] [2,2]"
    pareto: str = ""
    # runner=bridge: the best layout's tokens trained per second per GPU at the key's m
    # (m*mbs*dp*seq / step / (tp*cp*dp*pp)): what compares keys of different tp, pp or dp,
    # whose step times are not for the same work on the same GPUs; None for the attention
    # runner (one layer's attention, not a training step)
    tokens_per_gpu_s: Optional[float] = None
    # layouts early stopping ended without an interval of their own: outside the verdict's
    # claim ("[4,2] [8,1]"); and the confidence the verdict was decided at (its look's share)
    stopped_early: str = ""
    level: Optional[float] = None
    schema_version: int = RECOMMENDATION_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "") -> "Recommendation":
        _check_version(d, RECOMMENDATION_SCHEMA, "recommendation", where)
        known, _ = _split(cls, d)
        known.update({k: key_field(known, k) for k in OLDER_ROW_DEFAULTS})
        for text in ("pareto", "verdict", "tied", "lighter", "undecided", "stopped_early"):
            if known.get(text) is None:
                known[text] = ""
        if known.get("n_trials") is None:
            known["n_trials"] = 0
        return cls(**{**known, "schema_version": RECOMMENDATION_SCHEMA})


RECOMMENDATION_COLUMNS = tuple(f.name for f in fields(Recommendation))


@dataclass(frozen=True, kw_only=True)
class Verification:
    """What proves a trial ran with CP active, read from ``TrialResult.verification``.

    Attention runner: its groups matched the plan and its output and gradients matched
    single-process attention (hcp-facts.md section 4). Bridge runner: every TE attention
    module held the planned groups at train start (job/bridge_verify.py: ``cp_active``).
    runner=synthetic: nothing ran, so nothing needs proving (its key is runner=synthetic
    and never mixes with measured keys); the evidence names the truth file and seed.
    """

    kind: str  # "attention", "bridge" or "synthetic"
    groups_match: bool = False
    numerics_passed: bool = False
    cp_active_checked: bool = False
    cp_active_problems: tuple[str, ...] = ()
    schema_version: int = VERIFICATION_SCHEMA

    @property
    def verified(self) -> bool:
        if self.kind == "synthetic":
            return True
        if self.kind == "bridge":
            return self.cp_active_checked and not self.cp_active_problems
        return self.groups_match and self.numerics_passed

    def to_dict(self) -> dict[str, Any]:
        """The evidence's shape, reduced to what the verdict reads."""
        if self.kind == "synthetic":
            body: dict[str, Any] = {"synthetic": True}
        elif self.kind == "bridge":
            body = {"cp_active": {"checked": self.cp_active_checked,
                                  "problems": list(self.cp_active_problems)}}
        else:
            body = {"groups": {"match": self.groups_match},
                    "numerics": {"passed": self.numerics_passed}}
        return {**body, "schema_version": self.schema_version}

    @classmethod
    def from_dict(cls, evidence: dict[str, Any], where: str = "") -> "Verification":
        _check_version(evidence, VERIFICATION_SCHEMA, "verification", where)
        if "synthetic" in evidence:
            return cls(kind="synthetic")
        if "cp_active" in evidence:
            cp = evidence["cp_active"] or {}
            problems = cp.get("problems") or ()
            return cls(kind="bridge", cp_active_checked=bool(cp.get("checked")),
                       cp_active_problems=tuple(str(p) for p in problems))
        return cls(kind="attention",
                   groups_match=bool((evidence.get("groups") or {}).get("match")),
                   numerics_passed=bool((evidence.get("numerics") or {}).get("passed")))


@dataclass(frozen=True)
class SweepKey:
    """What a recommendation is for: one measured configuration of one software stack."""

    cluster: str
    model: str
    tp: int
    cp: int
    seq: int
    runner: str
    env_tag: str
    pp: int = 1
    dp: int = 1
    mbs: int = 1
    micro_batches: int = 1
    mix: str = ""  # packed sequences (data.packing=thd): the mix's label; "": fixed length

    @property
    def name(self) -> str:
        # a field at its OLDER_ROW_DEFAULTS value is left out so that keys (and their slugs,
        # row folders and optuna studies) stored before it joined the key stay the same
        return "|".join(f"{k}={getattr(self, k)}" for k in KEY_FIELDS
                        if getattr(self, k) != OLDER_ROW_DEFAULTS.get(k))

    @property
    def slug(self) -> str:
        return name_slug(self.name)

    @classmethod
    def of(cls, row: dict[str, Any]) -> "SweepKey":
        """The key a row (or recommendation) belongs to, from its key fields."""
        return cls(**{k: key_field(row, k) for k in KEY_FIELDS})

    def holds(self, row: dict[str, Any]) -> bool:
        """The row is one of this key's trials (selected by the key's fields, not an id)."""
        return all(key_field(row, k) == getattr(self, k) for k in KEY_FIELDS)


def key_rows(rows: list[dict[str, Any]], key: SweepKey) -> list[dict[str, Any]]:
    """The rows (or recommendations) of one sweep key, selected by its fields: the one
    selection every command uses (an older row's missing key fields read as their defaults)."""
    return [r for r in rows if key.holds(r)]
