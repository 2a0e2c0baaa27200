"""One trial's flat row (``records.TrialRow``) from its sweep key, spec and result: what a
sweep stores for each trial (``store`` re-exports ``trial_row``)."""
from __future__ import annotations

import json
from typing import Any, Optional

from hcp_tune.store.records import KEY_FIELDS, SweepKey, TrialRow, Verification
from hcp_tune.spec import TrialResult, TrialSpec


def single_run_fields(key: SweepKey, spec: TrialSpec, result: TrialResult) -> dict[str, Any]:
    """The micro-batch fields of a row measured by one run (``spec``): runner=bridge
    measured at ``spec.micro_batches`` (at the user's m, its median is the step there);
    the attention runner has none."""
    if spec.runner != "bridge":
        return {}
    m = max(1, spec.micro_batches)
    return {"measured_micro_batches": json.dumps([m]),
            "point_medians_s": json.dumps([result.median_s]),
            "step_at_user_m_s": result.median_s if m == key.micro_batches else None}


def trial_row(key: SweepKey, spec: TrialSpec, result: TrialResult, *,
              micro: Optional[dict[str, Any]] = None, **extra: Any) -> dict[str, Any]:
    """One flat row (``records.TrialRow.to_dict``): the key, the layout, the status and
    every measured statistic. ``micro``: the micro-batch fields of a trial measured at
    several m (``engine.trials.point_fields``); default those of one run of ``spec``."""
    return TrialRow(
        **{k: getattr(key, k) for k in KEY_FIELDS},
        trial_id=spec.trial_id,
        a2a=spec.a2a,
        p2p=spec.p2p,
        comm_type=spec.comm_type,
        status=result.status.value,
        failure_class=result.failure_class.value if result.failure_class else "",
        error=result.error or "",
        median_s=result.median_s,
        p10_s=result.p10_s,
        p90_s=result.p90_s,
        steps=len(result.step_times_s),
        step_times_s=json.dumps(result.step_times_s),
        peak_mem_bytes=result.peak_mem_bytes,
        tflops_per_gpu=result.tflops_per_gpu,
        wall_s=result.wall_s,
        mem_note=result.mem_note,
        backend=result.backend,
        te_backend=result.te_backend,
        qkv_format=result.qkv_format,
        notes="; ".join(result.notes),
        verified=verified(result.verification),
        fingerprint=json.dumps(result.fingerprint, sort_keys=True),
        job_id=result.job_id or "",
        log_path=result.log_path or "",
        phases_s=json.dumps(result.phases_s, sort_keys=True),
        **(single_run_fields(key, spec, result) if micro is None else micro),
        extra=extra,
    ).to_dict()


def verified(evidence: dict[str, Any]) -> bool:
    """The trial proved CP active (``records.Verification``)."""
    return Verification.from_dict(evidence).verified
