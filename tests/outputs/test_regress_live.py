"""One live check of ``regress`` with the CPU attention runner: two env tags of cluster=local
model=tiny cp=2 seq=64, 3 trials per layout each, the candidate's with
``HCP_TUNE_INJECT_DELAY=p2p:0.2`` (0.2 s before each of the ring's transfers). What the
test proves is the plumbing: the knob reaches the ring layout's trials through the local
executor (each of them takes at least the injected sleep, a floor no load can lower), the
fingerprint records it, and ``regress`` reads both tags, warns about the delay and exits
with the code its verdicts give. It asserts no verdict: a verdict on live CPU timings
depends on the machine's load; the verdicts are tested on recorded rows, including this
scenario's recorded pool (benchmarks/regress_pool_rows.jsonl, delay-1 and delay-2).

The candidate is measured the way a user would: ``python -m hcp_tune sweep ...
executor=local search.repeats=3`` with the knob in its environment (so the knob reaches
the job through the executor and the fingerprint through the store). The baseline's 6
trials run interleaved ([1,2], [2,1], [1,2], ...) in one set of local processes
(``launch.run_local_batch``, the launcher the local executor runs) to keep the test near
a minute on a shared 2-core machine.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hcp_tune import config
from hcp_tune.engine.launch import run_local_batch
from hcp_tune.store.folder import ResultStore, SweepKey, trial_row
from hcp_tune.engine.trials import spec_for
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
def test_injected_p2p_delay_reaches_ring_trials_and_regress_reads_them(tmp_path, monkeypatch):
    results = tmp_path / "results"
    measure(results, "base", monkeypatch)
    sweep = subprocess.run(
        [sys.executable, "-m", "hcp_tune", "sweep", *CPU, "executor=local", "env_tag=slow",
         f"search.repeats={REPEATS}", "search.purpose=regress", f"results_dir={results}"],
        capture_output=True, text=True, cwd=REPO, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), "HCP_TUNE_INJECT_DELAY": DELAY})
    assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-2000:]
    rows = ResultStore(results).rows()
    delays = {(r["env_tag"], json.loads(r["fingerprint"])["inject_delay"]) for r in rows}
    assert delays == {("base", None), ("slow", DELAY)}
    assert all("settings" in json.loads(r["fingerprint"]) for r in rows)

    # what the delay guarantees whatever the load: a sleep of 0.2 s before each ring
    # transfer, so every delayed ring trial's step takes at least that; no verdict here
    # (a verdict on live CPU timings depends on the machine's load: the verdicts are
    # tested on recorded rows, tests/outputs/test_regress_verdict.py)
    slow_ring = [r["median_s"] for r in rows if r["env_tag"] == "slow" and r["a2a"] == 1]
    assert len(slow_ring) == REPEATS and min(slow_ring) >= 0.2, slow_ring
    rep = regress.compare(rows, regress.Options(baseline="base", candidate="slow"))
    assert sorted(c.layout for c in rep.comparisons) == ["[1,2]", "[2,1]"]
    assert any(f"HCP_TUNE_INJECT_DELAY={DELAY}" in w for w in rep.warnings)

    cli = subprocess.run(
        [sys.executable, "-m", "hcp_tune", "regress", "baseline=base", "candidate=slow",
         f"results_dir={results}"], capture_output=True, text=True,
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert cli.returncode == rep.exit_code and cli.returncode in (0, 1, 4), cli.stdout + cli.stderr
    assert "regress base -> slow:" in cli.stdout
    assert (results / "regress-base-vs-slow.html").exists()
