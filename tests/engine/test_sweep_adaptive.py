"""Adaptive measuring (issue 28): every kept layout gets search.min_repeats trials, then
only the undecided ones get more, up to search.repeats, decided from the stored rows; and
the search keys' bad values."""
import dataclasses

import pytest

from hcp_tune import config
from hcp_tune.engine.sweep_adaptive import closed, next_round, usable_counts
from hcp_tune.engine.sweep_plan import kept_by_key, plan_sweep
from hcp_tune.errors import ConfigError
from tests.helpers import hcp


def rows(a2a, medians, status="ok", error=None):
    return [{"a2a": a2a, "p2p": 4 // a2a, "status": status, "verified": True, "median_s": m,
             "peak_mem_bytes": 0, "error": error, "comm_type": "a2a"} for m in medians]


ROUND = dict(min_repeats=3, repeats=5, tie_threshold=0.02)


def test_layouts_short_of_min_repeats_come_first():
    got = rows(4, [1.0, 1.0, 1.0]) + rows(2, [2.0])
    assert next_round(got, [4, 2, 1], **ROUND) == [2, 1]


def test_a_settled_key_is_done_and_an_unsettled_one_measures_only_its_undecided_layouts():
    settled = rows(4, [1.0, 1.01, 0.99]) + rows(2, [1.5, 1.52, 1.49]) + rows(1, [2, 2.1, 2])
    assert next_round(settled, [4, 2, 1], **ROUND) == []
    close = rows(4, [1.0, 1.06, 0.97]) + rows(2, [1.02, 0.99, 1.07]) + rows(1, [2, 2.1, 2])
    assert sorted(next_round(close, [4, 2, 1], **ROUND)) == [2, 4]
    # the order of the stored rows does not matter: a resumed sweep decides the same
    assert sorted(next_round(list(reversed(close)), [4, 2, 1], **ROUND)) == [2, 4]


def test_the_cap_and_the_layouts_out_of_the_running_get_nothing_more():
    close = rows(4, [1.0, 1.06, 0.97, 1.0, 1.03]) + rows(2, [1.02, 0.99, 1.07, 1.0, 1.05])
    assert next_round(close, [4, 2], **ROUND) == []  # both at search.repeats=5
    lost = rows(4, [1.0, 1.0, 1.0]) + rows(2, [1.5], status="pruned")
    assert closed(lost) == {2} and next_round(lost, [4, 2], **ROUND) == []


def test_pruned_cancelled_and_failed_trials_never_count_toward_repeats():
    got = (rows(4, [1.0]) + rows(4, [0.9], status="pruned", error="cancelled by the user")
           + rows(4, [None], status="cancelled") + rows(4, [None], status="failed"))
    assert usable_counts(got) == {4: 1}
    assert 4 not in closed(got, repeats=5)  # one ok trial, one failure: still in the running


CFG = config.load(["cluster=local", "model=tiny", "cp=4", "seq=256", "runner=attention"])


def test_the_default_plan_measures_each_layout_min_repeats_times_and_exhaustive_repeats():
    assert (CFG.search.adaptive, CFG.search.min_repeats, CFG.search.repeats) == (True, 1, 5)
    assert len(plan_sweep(CFG, [], {}).queue) == 3 * 1
    exhaustive = dataclasses.replace(CFG, search=dataclasses.replace(CFG.search, adaptive=False))
    assert len(plan_sweep(exhaustive, [], {}).queue) == 3 * 5
    (key,) = kept_by_key(CFG)
    stored = [{**r, **{k: getattr(key, k) for k in ("cluster", "model", "tp", "pp", "cp", "seq",
                                                   "runner", "env_tag", "dp", "mbs",
                                                   "micro_batches")},
               "trial_id": f"{key.slug}-t{i:03d}-a4"}
              for i, r in enumerate(rows(4, [1.0, 1.0]) + rows(2, [1.2], status="pruned"))]
    plan = plan_sweep(CFG, stored, {})
    assert sorted(p.cand.layout.a2a for p in plan.queue) == [1]  # [2,2] lost, [4,1] has 2
    three = dataclasses.replace(CFG, search=dataclasses.replace(CFG.search, min_repeats=3))
    plan = plan_sweep(three, stored, {})
    assert sorted(p.cand.layout.a2a for p in plan.queue) == [1, 1, 1, 4]


@pytest.mark.parametrize("override,says", [
    ("search.min_repeats=0", "search.min_repeats=0: expected an integer in 1..100"),
    ("search.min_repeats=6", "search.min_repeats=6 is above search.repeats=5"),
    ("search.tie_threshold=-1", "search.tie_threshold=-1: expected a number in 0..0.5"),
])
def test_bad_search_values_are_refused_in_one_line(override, says):
    with pytest.raises(ConfigError, match=says.replace(".", r"\.").replace("+", r"\+")):
        config.load(["cluster=local", "model=tiny", "cp=4", "seq=256", override])


def test_the_cli_exits_2_with_one_line_for_min_repeats_above_repeats():
    r = hcp("plan", "cluster=local", "model=tiny", "cp=4", "seq=256", "search.repeats=2",
            "search.min_repeats=3")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "search.min_repeats=3 is above search.repeats=2" in r.stderr


def _stored_row(key, a2a, median, n):
    from hcp_tune.store.folder import trial_row
    from hcp_tune.spec import Status, TrialResult, TrialSpec

    trial_id = f"{key.slug}-t{n:03d}-a{a2a}"
    spec = TrialSpec(trial_id=trial_id, a2a=a2a, p2p=4 // a2a, seq=key.seq, heads=8,
                     kv_heads=8, head_dim=8, runner=key.runner)
    res = TrialResult(trial_id=trial_id, status=Status.OK, median_s=median,
                      verification={"groups": {"match": True}, "numerics": {"passed": True}})
    return trial_row(key, spec, res)


def test_a_resumed_sweep_queues_the_same_round_from_what_is_stored(tmp_path):
    """The Sweeper's round comes from the stored rows: a fresh Sweeper over the same folder
    (a resume after a kill) plans exactly the same next trials."""
    from hcp_tune.store.folder import ResultStore
    from hcp_tune.engine.sweep import Sweeper

    cfg = config.load(["cluster=local", "model=tiny", "cp=4", "seq=256", "runner=attention",
                       "executor=local", f"results_dir={tmp_path}"])
    (key,) = kept_by_key(cfg)
    store = ResultStore(tmp_path)
    medians = {4: (1.0, 1.06, 0.97), 2: (1.02, 0.99, 1.07), 1: (2.0, 2.1, 2.05)}
    n = 0
    for a2a, ms in medians.items():
        for m in ms:
            store.add(_stored_row(key, a2a, m, n), key)
            n += 1
    store.rebuild()
    queued = []
    for _ in range(2):  # the first run, then the same command again
        sweeper = Sweeper(cfg, reporter=None)
        sweeper.plan()
        assert sweeper.queue == []  # min_repeats are in
        sweeper._next_round(key)
        queued.append(sorted(w.cand.layout.a2a for w in sweeper.queue))
    assert queued == [[2, 4], [2, 4]]  # only the undecided layouts, the same both times
