"""The TrialSpec a sweep hands a job for one candidate: ``trials.spec_for``'s layout, model
and files, plus what the data asks for (packed sequences: the documents of each sequence, the typical
ones of a draw from the key's length mix, ``packing.typical``; the same for every layout).

Every caller builds specs here, so a packed key's trials never run unpacked. (``trials.py``
stays as the ranking rule was frozen with: benchmarks/synthetic_loop.py RULE_FILES.)
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from hcp_tune.config import SweepConfig
from hcp_tune.engine import trials
from hcp_tune.packing import typical
from hcp_tune.space.layout import Candidate
from hcp_tune.spec import TrialSpec


def spec_for(cfg: SweepConfig, cand: Candidate, trial_id: str, progress_dir: Path) -> TrialSpec:
    """The trial a candidate layout runs (``trials.spec_for``), packed when the data is."""
    spec = trials.spec_for(cfg, cand, trial_id, progress_dir)
    mix = cfg.mix_at(cand.seq)
    if mix is None:
        return spec
    return dataclasses.replace(spec, packing="thd", mix=mix.label,
                               packed_docs=typical(mix, cand.seq, cand.layout.cp, cfg.mbs))
