"""One live check of ``regress`` with the CPU attention runner: two env tags of cluster=local
model=tiny cp=2 seq=64, 3 trials per layout each, the candidate's with
``HCP_TUNE_INJECT_DELAY=p2p:0.2`` (0.2 s before each of the ring's 4 transfers per step:
about 0.8 s against a step of a few to 30 milliseconds). The slowdown must be flagged on the
layout with a ring level, [1,2], and not on pure a2a, [2,1].

The candidate is measured the way a user would: ``python -m hcp_tune sweep ...
executor=local search.repeats=3`` with the knob in its environment (so the knob reaches
the job through the executor and the fingerprint through the store). The baseline's 6
trials run interleaved ([1,2], [2,1], [1,2], ...) in one set of local processes
(``launch.run_local_batch``, the launcher the local executor runs) to keep the test near
a minute on a shared 2-core machine. The threshold is 900% (flag only a 10x change): the
delay makes a ring step some 25-100x slower, while a few-millisecond CPU step measured in
a fresh job can be 3-10x slower than in warm shared processes (seen in CI: a baseline
ring step of 24-34 ms, against 0.23 s with a 0.05 s delay, was under 10x). What the
test proves is which layouts the injected delay reaches, not the CPU's run-to-run noise.
"""
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_tune import config
from hcp_tune.engine.launch import run_local_batch
from hcp_tune.engine.store import ResultStore, SweepKey, trial_row
from hcp_tune.engine.sweep import spec_for
from hcp_tune.outputs import regress
from hcp_tune.space.plan import candidates

REPO = Path(__file__).resolve().parents[2]
REPEATS = 3
DELAY = "p2p:0.2"
CPU = ("cluster=local", "model=tiny", "cp=2", "seq=64", "runner=attention",
       "runner.warmup_steps=1", "runner.measure_steps=3")


def measure(results: Path, tag: str, monkeypatch) -> None:
    """``REPEATS`` trials of each layout, interleaved, in one set of local processes."""
    cfg = config.load([*CPU, f"env_tag={tag}", f"results_dir={results}"])
    kept = [c for c in candidates(cfg) if c.kept]
    assert sorted(c.layout.a2a for c in kept) == [1, 2]
    key = SweepKey(cluster="local", model="tiny", tp=1, cp=2, seq=64, runner="attention",
                   env_tag=tag)
    (results / "progress").mkdir(parents=True, exist_ok=True)
    specs = [spec_for(cfg, c, f"{key.slug}-r{r}-a{c.layout.a2a}", results / "progress")
             for r in range(REPEATS) for c in kept]
    monkeypatch.delenv("HCP_TUNE_INJECT_DELAY", raising=False)  # the baseline: no delay
    results_of = run_local_batch(specs, workdir=results / "trials" / tag)
    store = ResultStore(results)
    for spec, res in zip(specs, results_of):
        assert res.status.value == "ok", (res.error, res.log_path)
        store.add(trial_row(key, spec, res), key)


@pytest.mark.multiproc
def test_injected_p2p_delay_is_flagged_on_ring_layouts_only(tmp_path, monkeypatch):
    results = tmp_path / "results"
    measure(results, "base", monkeypatch)
    sweep = subprocess.run(
        [sys.executable, "-m", "hcp_tune", "sweep", *CPU, "executor=local", "env_tag=slow",
         f"search.repeats={REPEATS}", "search.early_stop=false", f"results_dir={results}"],
        capture_output=True, text=True, cwd=REPO, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), "HCP_TUNE_INJECT_DELAY": DELAY})
    assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-2000:]
    rows = ResultStore(results).rows()
    delays = {(r["env_tag"], json.loads(r["fingerprint"])["inject_delay"]) for r in rows}
    assert delays == {("base", None), ("slow", DELAY)}
    assert all("settings" in json.loads(r["fingerprint"]) for r in rows)

    rep = regress.compare(rows, regress.Options(baseline="base", candidate="slow",
                                                threshold=9.0))
    verdicts = {c.layout: c.verdict for c in rep.comparisons}
    assert verdicts == {"[1,2]": "regression", "[2,1]": "ok"}, [
        (c.layout, c.base_s, c.cand_s) for c in rep.comparisons]
    ring = next(c for c in rep.comparisons if c.layout == "[1,2]")
    assert statistics.median(ring.cand_s) / statistics.median(ring.base_s) > 10.0  # > 900%
    # the whole interval is a slowdown (its width is the CPU's run-to-run noise: one slow
    # few-millisecond baseline repeat under CI load widened it to 3.8x..)
    assert ring.ci[0] > 1.0
    assert any(f"HCP_TUNE_INJECT_DELAY={DELAY}" in w for w in rep.warnings)

    cli = subprocess.run(
        [sys.executable, "-m", "hcp_tune", "regress", "baseline=base", "candidate=slow",
         "threshold=9.0", f"results_dir={results}"], capture_output=True, text=True,
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert "1 of 2 key/layout(s) flagged" in cli.stdout
    assert (results / "regress-base-vs-slow.html").exists()
