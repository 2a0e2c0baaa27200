"""``sweep_plan.plan_sweep``: the sweep's plan from (config, stored rows, outstanding
trials), as a pure function: no SLURM, no processes, no files. Stored rows are made by the
store's own writer (``store.trial_row``)."""
import dataclasses

import pytest

from hcp_tune import config
from hcp_tune.costmodel import predict
from hcp_tune.costmodel.memory import advice_line
from hcp_tune.store.folder import key_rows, trial_row
from hcp_tune.engine.sweep_plan import kept_by_key, key_for, plan_sweep
from hcp_tune.store.studies import Outstanding
from hcp_tune.spec import FailureClass, Status, TrialResult, TrialSpec

# cp=4 on the tiny model: layouts [1,4] [2,2] [4,1]; the cost model predicts 4, 2, 1 fastest first
# exhaustive, one trial a layout (what these tests pin); the adaptive plan: test_sweep_adaptive.py
CFG = config.load(["cluster=local", "model=tiny", "cp=4", "seq=[256,512]", "runner=attention",
                   "search.adaptive=false", "search.repeats=1"])
KEYS = list(kept_by_key(CFG))
K256, K512 = KEYS


def cfg_with(**search):
    return dataclasses.replace(CFG, search=dataclasses.replace(CFG.search, **search))


def stored(key, a2a, status=Status.OK, failure=None, trial_id=None, **fields):
    trial_id = trial_id or f"{key.slug}-t{a2a:03d}-a{a2a}"
    spec = TrialSpec(trial_id=trial_id, a2a=a2a, p2p=4 // a2a, seq=key.seq, heads=8,
                     kv_heads=8, head_dim=8, runner=key.runner)
    res = TrialResult(trial_id=trial_id, status=status, failure_class=failure,
                      median_s=0.1 if status is Status.OK else None)
    return {**trial_row(key, spec, res), **fields}


def queued(plan, key=None):
    return [(p.key.seq, p.cand.layout.a2a) for p in plan.queue if key in (None, p.key)]


def test_the_queue_follows_the_prediction_when_asked_and_candidate_order_otherwise():
    by_prediction = [c.layout.a2a for c, _ in predict.ordering(CFG) if c.seq == 256]
    assert by_prediction == [4, 2, 1]  # not the candidate order: the test can tell them apart
    assert queued(plan_sweep(CFG, [], {})) == [(256, 4), (256, 2), (256, 1),
                                                (512, 4), (512, 2), (512, 1)]
    plain = plan_sweep(cfg_with(order_by_prediction=False), [], {})
    assert queued(plain, K256) == [(256, 1), (256, 2), (256, 4)]


def test_repeats_come_after_every_layout_of_the_key_was_planned_once():
    plan = plan_sweep(cfg_with(repeats=2), [], {})
    assert queued(plan, K256) == [(256, a) for a in (4, 2, 1, 4, 2, 1)]
    assert len(plan.queue) == 12


def test_a_stored_ok_trial_is_not_planned_again():
    plan = plan_sweep(CFG, [stored(K256, 2)], {})
    assert queued(plan, K256) == [(256, 4), (256, 1)]
    assert queued(plan, K512) == [(512, 4), (512, 2), (512, 1)]
    assert plan.resumed == 1 and plan.stored[K256][0]["a2a"] == 2


def test_a_stored_ok_trial_counts_towards_repeats():
    plan = plan_sweep(cfg_with(repeats=2), [stored(K256, 2)], {})
    assert queued(plan, K256) == [(256, a) for a in (4, 1, 4, 2, 1)]  # the stored one is the first


@pytest.mark.parametrize("status,failure", [
    (Status.CANCELLED, None),
    (Status.FAILED, FailureClass.ENVIRONMENT),
])
def test_cancelled_trials_and_environment_failures_are_planned_again(status, failure):
    plan = plan_sweep(CFG, [stored(K256, 2, status, failure)], {})
    assert queued(plan, K256) == [(256, 4), (256, 2), (256, 1)]
    assert plan.resumed == 0 and plan.kept_failures == {}


def test_other_failures_stand_and_are_counted_as_kept():
    rows = [stored(K256, 2, Status.FAILED, FailureClass.OOM),
            stored(K256, 4, Status.FAILED, FailureClass.COMM)]
    plan = plan_sweep(CFG, rows, {})
    assert queued(plan, K256) == [(256, 1)]
    assert plan.kept_failures == {K256: {"oom": 1, "comm": 1}} and plan.retried == 0


def test_retry_oom_replans_only_the_oom_failures():
    rows = [stored(K256, 2, Status.FAILED, FailureClass.OOM),
            stored(K256, 4, Status.FAILED, FailureClass.COMM)]
    plan = plan_sweep(cfg_with(retry="oom"), rows, {})
    assert queued(plan, K256) == [(256, 2), (256, 1)]
    assert plan.retried == 1 and plan.kept_failures == {K256: {"comm": 1}}
    assert plan.resumed == 1  # the comm failure stands


def test_layouts_predicted_slower_than_the_factor_are_stored_as_skipped_not_queued():
    plan = plan_sweep(cfg_with(skip_predicted_slower_than=1.05), [], {})
    assert [(s.key.seq, s.cand.layout.a2a) for s in plan.skipped] == [
        (256, 2), (256, 1), (512, 2), (512, 1)]
    assert queued(plan) == [(256, 4), (512, 4)]
    skip = plan.skipped[0]
    assert "skip_predicted_slower_than=1.05" in skip.reason and skip.predicted_step_s > 0


def test_a_layout_with_a_stored_trial_is_not_skipped_again():
    plan = plan_sweep(cfg_with(skip_predicted_slower_than=1.05), [stored(K256, 2)], {})
    assert [(s.key.seq, s.cand.layout.a2a) for s in plan.skipped if s.key == K256] == [(256, 1)]


def test_a_row_of_another_key_sharing_only_the_trial_id_prefix_is_not_counted():
    # stored under the seq=512 key, but its trial id starts with the seq=256 key's slug
    impostor = stored(K512, 2, trial_id=f"{K256.slug}-t000-a2")
    plan = plan_sweep(CFG, [impostor], {})
    assert queued(plan, K256) == [(256, 4), (256, 2), (256, 1)]
    assert queued(plan, K512) == [(512, 4), (512, 1)]  # its own key counts it
    assert plan.stored[K256] == [] and plan.resumed == 1


def test_a_row_of_the_key_is_counted_whatever_its_trial_id():
    plan = plan_sweep(CFG, [stored(K256, 2, trial_id="manual-2x2-s256")], {})
    assert queued(plan, K256) == [(256, 4), (256, 1)]


def test_a_row_stored_by_another_env_tag_is_not_counted():
    other = stored(dataclasses.replace(K256, env_tag="te-2.10"), 2,
                   trial_id=f"{K256.slug}-t000-a2")
    plan = plan_sweep(CFG, [other], {})
    assert queued(plan, K256) == [(256, 4), (256, 2), (256, 1)] and plan.resumed == 0


def test_a_row_stored_before_pp_joined_the_key_counts_for_pp_1():
    row = stored(K256, 2)
    del row["pp"]
    assert key_rows([row], K256) == [row]
    assert key_rows([row], dataclasses.replace(K256, pp=2)) == []


def outstanding(key, a2a, number=7):
    return Outstanding(number=number, a2a=a2a, trial_id=f"{key.slug}-t{number:03d}-a{a2a}",
                       job_id="4242", executor="slurm", folder="/jobs")


def test_outstanding_trials_are_reattached_not_planned_again():
    o = outstanding(K256, 2)
    plan = plan_sweep(CFG, [], {K256: [o]})
    assert [(r.key, r.cand.layout.a2a, r.trial) for r in plan.reattach] == [(K256, 2, o)]
    assert queued(plan, K256) == [(256, 4), (256, 1)] and plan.reattached == 1
    assert plan.resumed == 0


def test_an_outstanding_trial_whose_row_is_stored_is_not_reattached():
    o = outstanding(K256, 2)
    plan = plan_sweep(CFG, [stored(K256, 2, trial_id=o.trial_id)], {K256: [o]})
    assert plan.reattach == [] and plan.resumed == 1
    assert queued(plan, K256) == [(256, 4), (256, 1)]


def test_the_estimate_counts_exactly_the_planned_trials():
    plan = plan_sweep(CFG, [stored(K256, 2)], {K512: [outstanding(K512, 1)]},)
    assert plan.estimate.trials == len(plan.queue) == 4
    want = [plan.costs[(p.cand.tp, p.cand.seq, p.cand.layout.a2a)] for p in plan.queue]
    assert plan.estimate.gpu_hours == pytest.approx(sum(c.gpu_hours for c in want))
    assert plan.estimate_text.startswith("estimate: 4 trial(s)")
    full = plan_sweep(CFG, [], {})
    assert full.estimate.gpu_hours > plan.estimate.gpu_hours


def test_only_cuts_the_plan_to_the_chosen_layouts():
    plan = plan_sweep(cfg_with(skip_predicted_slower_than=1.05), [], {},
                      only={(1, 256): {2, 4}})
    assert queued(plan) == [(256, 4)] and [s.cand.layout.a2a for s in plan.skipped] == [2]
    assert plan.keys == [K256, K512]  # every key is still a key of the sweep


def test_the_plan_is_deterministic():
    rows = [stored(K256, 2, Status.FAILED, FailureClass.OOM)]
    a, b = (plan_sweep(cfg_with(repeats=2), rows, {}) for _ in range(2))
    assert queued(a) == queued(b) and a.kept_failures == b.kept_failures
    assert a.estimate == b.estimate


def test_notes_and_fit_advice_are_the_predict_commands():
    cfg = config.load(["cp=8", "seq=131072", "tp=1", "pp=1", "model=llama3-8b",
                       "cluster=dgx-h100", "runner=attention"])
    plan = plan_sweep(cfg, [], {})
    rows = predict.predict_rows(cfg, params=predict.CostParams())
    assert plan.notes == rows["notes"]
    assert plan.fit_advice == [advice_line(a, 80, "sweep") for a in rows["fit_advice"]]
    assert len(plan.fit_advice) == 1 and "smallest change that fits: recompute=full" \
        in plan.fit_advice[0]


OOM_KEY = ["cp=8", "seq=[32768,131072]", "tp=1", "pp=1", "model=llama3-8b", "cluster=dgx-h100",
           "runner=bridge"]


def test_runner_bridge_refuses_a_key_whose_every_layout_is_predicted_not_to_fit():
    """issue 38: llama3-8b at 128K on tp=1 pp=1 is predicted far over 80 GiB for every
    layout; runner=bridge queued each one to OOM after its whole start-up. 32K fits."""
    plan = plan_sweep(config.load(OOM_KEY), [], {})
    assert plan.refused == [(1, 131072)]
    assert {p.key.seq for p in plan.queue} == {32768} and len(plan.queue) == 4
    assert [len(v) for k, v in plan.kept.items() if k.seq == 131072] == [0]  # no adaptive round
    (line,) = plan.fit_advice
    assert line.startswith("sweep: no layout of tp=1 seq=131072 is predicted to fit 80 GiB; "
                           "smallest change that fits: recompute=full")
    assert "model.recompute_granularity=full" in line
    assert line.endswith("runner=bridge queues none of its layouts (each would run its whole "
                         "start-up, then fail as oom): apply that change, or set "
                         "search.allow_predicted_oom=true to measure them anyway")


def test_the_user_can_ask_for_the_predicted_oom_key_and_the_attention_runner_is_never_refused():
    plan = plan_sweep(config.load([*OOM_KEY, "search.allow_predicted_oom=true"]), [], {})
    assert plan.refused == [] and len(plan.queue) == 8
    assert "queues none" not in plan.fit_advice[0]
    attention = plan_sweep(config.load([*OOM_KEY[:-1], "runner=attention"]), [], {})
    assert attention.refused == [] and len(attention.queue) == 8


def test_keys_are_the_sweeps_keys_with_a_kept_layout():
    assert [(k.tp, k.seq, k.runner, k.env_tag) for k in KEYS] == [
        (1, 256, "attention", CFG.env_tag), (1, 512, "attention", CFG.env_tag)]
    assert key_for(CFG, kept_by_key(CFG)[K256][0]) == K256


def test_the_sweep_shows_the_recommendations_of_its_own_keys_only():
    from hcp_tune.cli import _own_recommendations
    from hcp_tune.store.folder import KEY_FIELDS, recommendations
    from hcp_tune.engine.sweep import SweepSummary

    mine = stored(K256, 2)
    other = stored(dataclasses.replace(K256, env_tag="te-2.10"), 2, trial_id="x-a2")
    bridge = stored(dataclasses.replace(K256, runner="bridge"), 2, trial_id="y-a2")
    for r in (mine, other, bridge):
        r["verified"] = True
    recs = recommendations([mine, other, bridge])
    assert len(recs) == 3
    (got,) = _own_recommendations(SweepSummary(keys=[K256], recommendations=recs))
    assert {f: got[f] for f in KEY_FIELDS} == {f: getattr(K256, f) for f in KEY_FIELDS}


def test_a_sweep_whose_every_key_was_refused_says_so_not_that_no_trial_ended_ok():
    from hcp_tune.engine.sweep import SweepSummary
    from hcp_tune.outputs.ui import unmeasured_lines

    plan = plan_sweep(config.load(OOM_KEY), [], {})
    key = next(k for k in plan.keys if k.seq == 131072)
    summary = SweepSummary(keys=[key], refused=list(plan.refused))
    (line,) = unmeasured_lines(summary, set(), "trials.csv")
    assert "tp=1 seq=131072: refused, every layout is predicted not to fit" in line
    assert "no trial ended ok" not in line
