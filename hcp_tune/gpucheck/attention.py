"""The attention step of the GPU check: cp=4 trials of [4,1], [2,2] and [1,4] built the way a
sweep builds them, and one PASS/FAIL verdict line per layout (``verdict_line`` is shared
with the Bridge step, ``gpucheck.bridge``)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from hcp_tune.spec import Status, TrialResult, TrialSpec

CP = 4
LAYOUTS = ((4, 1), (2, 2), (1, 4))  # [a2a, p2p]: pure a2a, hierarchical, pure ring


@dataclass(frozen=True)
class Mode:
    """What one mode runs: the profile, the workload and the backend it expects."""

    name: str
    cluster: str
    model: str
    seq: int
    backend: str
    dtype: str = "bf16"


GPU = Mode("gpu", cluster="dgx-h100", model="llama3-8b", seq=16384, backend="te")
CPU = Mode("cpu", cluster="local", model="tiny", seq=256, backend="torch")


def build_specs(mode: Mode, progress_dir: Path) -> list[TrialSpec]:
    """The three layouts' trials, built the way a sweep builds them."""
    from hcp_tune import config
    from hcp_tune.engine.trialspec import spec_for
    from hcp_tune.errors import ConfigError
    from hcp_tune.space import plan

    cfg = config.load([f"cp={CP}", f"seq={mode.seq}", "tp=1", f"model={mode.model}",
                       f"cluster={mode.cluster}", "runner=attention", f"dtype={mode.dtype}"])
    cands = {(c.layout.a2a, c.layout.p2p): c for c in plan.candidates(cfg)}
    specs = []
    for a2a, p2p in LAYOUTS:
        cand = cands[(a2a, p2p)]
        if not cand.kept:
            raise ConfigError(f"layout [{a2a},{p2p}] is rejected for model={mode.model} "
                              f"seq={mode.seq}: {cand.reasons[0]}")
        spec = spec_for(cfg, cand, f"gpu-check-{mode.name}-{a2a}x{p2p}", progress_dir)
        # the sweep's CPU default is fp32; the check proves in bf16 on both, as TE would run
        specs.append(dataclasses.replace(spec, backend=mode.backend, dtype=mode.dtype,
                                         warmup_steps=2, measure_steps=3, progress_path=None))
    return specs


def verdict(spec: TrialSpec, res: TrialResult, mode: Mode) -> tuple[bool, str]:
    """(passed, one line) for one layout."""
    problems, parts = [], []
    groups = res.verification.get("groups", {})
    parts.append("groups " + ("match" if groups.get("match") else "DIFFER"))
    if not groups.get("match"):
        problems.append((groups.get("problems") or ["groups not checked"])[0])
    num = res.verification.get("numerics")
    if num:
        worst = max(num["errors"].values())
        parts.append(f"numerics {'pass' if num['passed'] else 'FAIL'} (worst {worst:.2g} "
                     f"<= {num['tolerance']:.2g}, vs {num.get('reference', 'float64')})")
        if not num["passed"]:
            problems.append(res.error or "numerics failed")
    else:
        parts.append("numerics not run")
    if res.tflops_per_gpu is not None:
        peak = spec.peak_tflops
        parts.append(f"{res.tflops_per_gpu:.3g} TFLOP/s/GPU " + (
            f"<= peak {peak:g}" if peak else "(no peak in this profile)"))
        if peak and res.tflops_per_gpu > peak:
            problems.append(res.error or "TFLOP/s above the peak")
    kernel = f": {res.te_backend}" if res.te_backend else ""
    parts.append(f"backend {res.backend or '?'}{kernel}")
    if res.backend and res.backend != mode.backend:
        problems.append(f"backend {res.backend} ran, {mode.backend} was expected")
    if mode.backend == "te" and res.backend == "te" and not res.te_backend:
        problems.append("TE's selected backend was not recorded (NVTE_DEBUG log not seen)")
    return verdict_line(f"gpu-check [{spec.a2a},{spec.p2p}] {spec.comm_type}", res, parts,
                        problems)


def verdict_line(label: str, res: TrialResult, parts: list[str], problems: list[str]
                 ) -> tuple[bool, str]:
    """PASS when the trial is ok and no check found a problem; else FAIL with the first
    problem (the trial's own status and error when no check named one)."""
    if res.status != Status.OK and not problems:
        cls = f" ({res.failure_class.value})" if res.failure_class else ""
        problems.append(f"{res.status.value}{cls}: {res.error}")
    ok = res.status == Status.OK and not problems
    line = (f"{label}: {'PASS' if ok else 'FAIL'}  " + " | ".join(parts)
            + ("" if ok else f"  -- {problems[0]}"))
    return ok, line
