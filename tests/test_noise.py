"""The one noise definition (hcp_tune/noise.py) and the places that use it."""
import math

import pytest

from hcp_tune import noise
from hcp_tune.store.folder import recommendations
from hcp_tune.engine.trials import should_prune


def test_band_noise_is_the_relative_half_width_of_p10_p90():
    assert noise.band_noise(2.0, 1.8, 2.2) == pytest.approx(0.1)
    assert noise.band_noise(None, 1.0, 2.0) == 0.0
    assert noise.band_noise(math.nan, 1.0, 2.0) == 0.0


def test_noise_of_samples_uses_the_same_percentiles():
    xs = [1.0, 1.1, 0.9, 1.0, 1.05]
    expect = (noise.percentile(xs, 90) - noise.percentile(xs, 10)) / (2 * noise.percentile(xs, 50))
    assert noise.noise(xs) == pytest.approx(expect)
    assert noise.noise([1.0]) == 0.0


def test_percentile_rejects_out_of_range_q():
    with pytest.raises(ValueError, match="q=101"):
        noise.percentile([1.0], 101)


def _row(a2a, median, p10, p90):
    return {"cluster": "c", "model": "m", "tp": 1, "pp": 1, "cp": 2, "seq": 8, "runner": "attention",
            "env_tag": "default", "a2a": a2a, "p2p": 2 // a2a,
            "comm_type": "a2a" if a2a == 2 else "p2p", "status": "ok", "verified": True,
            "median_s": median, "p10_s": p10, "p90_s": p90, "peak_mem_bytes": 0}


def test_prune_reads_the_noise_and_a_tie_no_longer_does():
    best = _row(2, 1.0, 0.9, 1.1)  # noise 0.1: band 0.9..1.1
    # issue 28: a tie is decided by the figures' intervals over trials
    # (engine/verdict.py), not one trial's band: one trial each says nothing
    assert recommendations([best, _row(1, 1.08, 1.07, 1.09)])[0]["verdict"] == "unsettled"
    # early stopping stops only beyond the whole band (2 x noise = 20% here)
    assert not should_prune([1.19, 1.2, 1.25], best)
    assert should_prune([1.21, 1.22, 1.25], best)
