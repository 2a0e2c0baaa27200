"""What a running trial exchanges with the orchestrator through files: the progress line it
appends after each measured step, and the stop file it reads (early stop, Ctrl-C)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from hcp_tune.spec import TrialSpec


def record_step(spec, step: int, t: float) -> None:
    """Appends one measured step's time to the spec's progress file (rank 0 only)."""
    if spec.progress_path:
        with open(spec.progress_path, "a") as f:
            f.write(json.dumps({"trial_id": spec.trial_id, "step": step, "time_s": t}) + "\n")


def stop_reason(spec: TrialSpec) -> Optional[str]:
    """The orchestrator's stop file's text, or None when there is none."""
    if not spec.stop_path:
        return None
    try:
        return Path(spec.stop_path).read_text().strip() or "stopped by the orchestrator"
    except OSError:
        return None
