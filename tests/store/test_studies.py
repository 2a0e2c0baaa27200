"""The optuna study per sweep key and the early-stopping rule."""
import pytest

from hcp_tune.engine.trials import read_progress, should_prune
from hcp_tune.store import studies
from hcp_tune.store.journals import open_storage
from hcp_tune.store.studies import LayoutStudy
from hcp_tune.spec import Status


def test_study_resumes_from_the_journal_file(tmp_path):
    storage = open_storage(str(tmp_path / "optuna.journal"))
    study = LayoutStudy(storage, "k", [1, 2, 4])
    n1, id1, got = study.ask(2, "slug")
    assert got == 2
    assert id1 == f"slug-t{n1:03d}-a2"
    study.submitted(n1, "123", "slurm", "/jobs")
    n2, _, _ = study.ask(4, "slug")  # asked, never submitted: the orchestrator died here
    # a new orchestrator process opens the same journal
    again = LayoutStudy(open_storage(str(tmp_path / "optuna.journal")), "k", [1, 2, 4])
    (o,) = again.outstanding(stored_ids=set())
    assert (o.number, o.a2a, o.job_id, o.executor) == (n1, 2, "123", "slurm")
    assert again.outstanding(stored_ids={id1}) == []
    again.abandon_unsubmitted()
    states = {t.number: t.state.name for t in again.study.get_trials()}
    assert states[n2] == "FAIL" and states[n1] == "RUNNING"


def test_a_submission_cut_half_way_is_abandoned_not_reattached(tmp_path):
    """An orchestrator killed while it marked a trial submitted (three attributes, one
    write each) left a trial with some of them: the next sweep crashed on the missing
    'executor' (KeyError, found by a killed sweep under load). job_id is written last now,
    and a trial without all three is ended, not re-attached."""
    storage = open_storage(str(tmp_path / "optuna.journal"))
    study = LayoutStudy(storage, "k", [1, 2])
    n_new, _, _ = study.ask(1, "s")  # this version's order: executor and folder, no job_id yet
    for k, v in (("executor", "slurm"), ("folder", "/jobs")):
        study.study._storage.set_trial_user_attr(study._live[n_new]._trial_id, k, v)
    n_old, _, _ = study.ask(2, "s")  # an older version's order: job_id first
    study.study._storage.set_trial_user_attr(study._live[n_old]._trial_id, "job_id", "5")
    again = LayoutStudy(open_storage(str(tmp_path / "optuna.journal")), "k", [1, 2])
    assert again.outstanding(stored_ids=set()) == []
    again.abandon_unsubmitted()
    assert {t.number: t.state.name for t in again.study.get_trials()} == {
        n_new: "FAIL", n_old: "FAIL"}


def test_a_trial_carries_its_orchestrator_from_the_moment_it_is_asked(tmp_path, monkeypatch):
    """Two sweeps of one key at once: the second, starting, ends the RUNNING trials no live
    sweep on this host owns. A trial asked but not yet marked with its orchestrator looked
    abandoned, was ended, and the first sweep crashed marking it submitted. The enqueued
    trial now holds the orchestrator when ``ask`` returns it."""
    import optuna

    seen = []
    real_ask = optuna.Study.ask

    def ask(self, *a, **kw):
        trial = real_ask(self, *a, **kw)
        seen.append(dict(trial.user_attrs))  # before ``ask`` sets anything on it
        return trial

    monkeypatch.setattr(optuna.Study, "ask", ask)
    study = LayoutStudy(open_storage(str(tmp_path / "optuna.journal")), "k", [1, 2])
    study.ask(2, "s")
    assert seen and seen[0].get("orchestrator") == studies.ORCHESTRATOR


def test_a_trial_another_sweep_ended_is_submitted_and_stored_without_a_crash(tmp_path):
    """A sweep on another host cannot tell this one is alive, and may end its trial between
    ask and submit: marking it submitted must not crash the sweep, and its row, when the
    result comes, is stored as a trial of its own."""
    path = str(tmp_path / "optuna.journal")
    study = LayoutStudy(open_storage(path), "k", [1, 2])
    n, trial_id, _ = study.ask(1, "s")
    other = LayoutStudy(open_storage(path), "k", [1, 2])
    other.study.tell(n, state=optuna_fail(), skip_if_finished=True)
    study.submitted(n, "11", "slurm", "/jobs")  # raised UpdateFinishedTrialError before
    row = make_row(trial_id)
    study.tell(n, Status.OK, (1.0, 2.0), row=row)
    again = LayoutStudy(open_storage(path), "k", [1, 2])
    done = [t for t in again.study.get_trials() if t.state.name == "COMPLETE"]
    assert [t.user_attrs["trial_id"] for t in done] == [trial_id]


def optuna_fail():
    from optuna.trial import TrialState

    return TrialState.FAIL


def make_row(trial_id: str) -> dict:
    from test_store import row

    return {**row(1, 1.0), "trial_id": trial_id}


def test_a_narrower_later_sweep_of_a_key_reuses_its_study(tmp_path):
    """The command an unsettled key prints measures only its undecided layouts
    (search.a2a_sizes=[1,2]) in the folder that holds the whole sweep's study: optuna
    refuses a categorical parameter whose choices change, and the sweep crashed."""
    path = str(tmp_path / "optuna.journal")
    whole = LayoutStudy(open_storage(path), "k", [4, 1, 2], space=[1, 2, 4])
    n, _, _ = whole.ask(4, "s")
    whole.tell(n, Status.OK, (1.0, 0.0))
    narrow = LayoutStudy(open_storage(path), "k", [1, 2], space=[1, 2, 4])
    n1, _, got = narrow.ask(1, "s")
    narrow.submitted(n1, "7", "local", "/jobs")
    assert got == 1
    again = LayoutStudy(open_storage(path), "k", [], space=[1, 2, 4])  # replays the journal
    assert [o.a2a for o in again.outstanding(stored_ids=set())] == [1]


def test_a_study_begun_with_a_narrower_space_takes_a_layout_outside_it(tmp_path):
    """A study written before the space was the whole key's (its choices: the kept
    layouts then): a layout outside them rides as an attribute, read back the same."""
    path = str(tmp_path / "optuna.journal")
    old = LayoutStudy(open_storage(path), "k", [1, 2])
    old.tell(old.ask(1, "s")[0], Status.OK, (2.0, 0.0))
    wider = LayoutStudy(open_storage(path), "k", [1, 2, 4], space=[1, 2, 4])
    n, trial_id, got = wider.ask(4, "s")
    assert got == 4 and trial_id.endswith("-a4")
    wider.submitted(n, "8", "local", "/jobs")
    wider.tell(n, Status.OK, (1.0, 0.0))
    again = LayoutStudy(open_storage(path), "k", [1, 2, 4], space=[1, 2, 4])
    assert again.pareto_a2a() == {4}
    n2, _, _ = again.ask(2, "s")
    again.submitted(n2, "9", "local", "/jobs")
    assert [o.a2a for o in again.outstanding(stored_ids=set())] == [2]


def test_tell_maps_statuses_to_optuna_states(tmp_path):
    study = LayoutStudy(open_storage(str(tmp_path / "j")), "k", [1, 2])
    a, _, _ = study.ask(1, "s")
    b, _, _ = study.ask(2, "s")
    study.tell(a, Status.OK, (1.5, 100.0))
    study.tell(b, Status.PRUNED, None)
    trials = {t.number: t for t in study.study.get_trials()}
    assert trials[a].values == [1.5, 100.0] and trials[b].state.name == "PRUNED"
    assert study.pareto_a2a() == {1}


def test_rdb_url_storage_is_accepted(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    study = LayoutStudy(open_storage(url), "k", [1, 2])
    n, _, _ = study.ask(1, "s")
    study.tell(n, Status.FAILED, None)
    assert study.study.get_trials()[0].state.name == "FAIL"


BEST = {"median_s": 1.0, "p10_s": 0.98, "p90_s": 1.02}


@pytest.mark.parametrize(
    "steps,best,prune",
    [
        ([1.2, 1.3, 1.25], BEST, True),  # every step 20% slower than the best's median
        ([1.2, 1.3], BEST, False),  # too few steps to judge
        ([1.2, 1.04, 1.3], BEST, False),  # its fastest step is within 5% of the best
        ([1.2, 1.3, 1.25], None, False),  # nothing to compare with yet
        ([1.25, 1.3, 1.26], {"median_s": 1.0, "p10_s": 0.9, "p90_s": 1.1}, True),
        ([1.2, 1.3, 1.25], {"median_s": 1.0, "p10_s": 0.7, "p90_s": 1.5}, False),  # noisy best
    ],
)
def test_early_stopping_rule(steps, best, prune):
    assert should_prune(steps, best) is prune


def test_progress_is_read_as_the_job_writes_it_skipping_a_half_written_line(tmp_path):
    from types import SimpleNamespace

    from hcp_tune.job.progress import record_step

    p = tmp_path / "t.jsonl"
    spec = SimpleNamespace(progress_path=str(p), trial_id="t1")
    record_step(spec, 0, 1.5)
    record_step(spec, 1, 1.25)
    with open(p, "a") as f:
        f.write('{"trial_id": "t1", "step": 2, "ti')  # the line being written right now
    assert read_progress(str(p)) == [1.5, 1.25]
    assert read_progress(str(tmp_path / "missing")) == []


def test_a_trial_that_measured_all_its_steps_is_never_pruned(tmp_path):
    from types import SimpleNamespace

    from hcp_tune.engine.sweep import Sweeper

    progress = tmp_path / "t.jsonl"
    progress.write_text("".join(f'{{"step": {i}, "time_s": 2.0}}\n' for i in range(3)))
    spec = SimpleNamespace(progress_path=str(progress), measure_steps=3, result_path=None,
                           runner="attention")
    run = SimpleNamespace(spec=spec, points=[spec], key=SimpleNamespace(name="k"),
                          stopping=False)
    me = SimpleNamespace(best={"k": BEST}, prunable=lambda m: True)
    assert Sweeper._prune(me, run) is False  # 3 of 3 steps done: its result is on its way


def test_the_best_layouts_own_repeats_are_never_pruned():
    """Stopping the leader's slower repeats would leave its figure biased fast (issue 28)."""
    from types import SimpleNamespace

    from hcp_tune.engine.sweep import Sweeper

    best = {**BEST, "a2a": 2, "p2p": 2}
    me = SimpleNamespace(best={"k": best})
    member = SimpleNamespace(key=SimpleNamespace(name="k"),
                             spec=SimpleNamespace(a2a=2, p2p=2))
    assert Sweeper.prunable(me, member) is False
    member.spec = SimpleNamespace(a2a=4, p2p=1)
    assert Sweeper.prunable(me, member) is True


@pytest.mark.parametrize(
    "state,error,expected",
    [
        ("TIMEOUT", None, "time_limit"),
        ("OUT_OF_MEMORY", None, "oom"),
        ("FAILED", "RuntimeError: CUDA out of memory. Tried to allocate 2 GiB", "oom"),
        ("FAILED", "DistBackendError: Connection closed by peer", "comm"),
        ("FAILED", "ModuleNotFoundError: No module named 'transformer_engine'", "environment"),
        ("BOOT_FAIL_X", None, "unknown"),
    ],
)
def test_a_job_that_ended_without_a_result_is_classified(state, error, expected):
    from hcp_tune.engine.dispatch import JobOutcome, JobState
    from hcp_tune.engine.trials import failed_from_job
    from hcp_tune.spec import TrialSpec

    spec = TrialSpec(trial_id="t", a2a=2, p2p=2, seq=64, heads=8, kv_heads=8, head_dim=8)
    res = failed_from_job(spec, JobOutcome(state=JobState.FAILED, scheduler_state=state,
                                           error=error))
    assert res.failure_class.value == expected and res.status.value == "failed"
    assert res.error == (error or f"job ended: {state}")


@pytest.mark.parametrize("state", ["CANCELLED", "PREEMPTED", "NODE_FAIL", "REQUEUED"])
def test_a_job_ended_from_outside_is_cancelled_and_measured_again(state):
    from hcp_tune.engine.dispatch import JobOutcome, JobState
    from hcp_tune.engine.trials import failed_from_job
    from hcp_tune.spec import TrialSpec

    spec = TrialSpec(trial_id="t", a2a=2, p2p=2, seq=64, heads=8, kv_heads=8, head_dim=8)
    res = failed_from_job(spec, JobOutcome(state=JobState.FAILED, scheduler_state=state))
    assert res.status.value == "cancelled" and res.failure_class is None
    assert res.error == (f"job ended from outside the sweep ({state}); "
                         "measured again on the next run")


@pytest.mark.parametrize("seed", range(6))
def test_pareto_front_is_optunas_best_trials(seed):
    """``studies.pareto_front`` (n log n, no deep copy) returns the trials optuna's
    ``study.best_trials`` returns, ties and duplicates included, failures ignored."""
    import random

    import optuna
    from optuna.trial import TrialState, create_trial

    from hcp_tune.store.studies import pareto_front

    rng = random.Random(seed)
    study = optuna.create_study(directions=["minimize", "minimize"])
    study.add_trial(create_trial(values=[2.0, 20.0]))
    for _ in range(rng.randint(0, 60)):
        if rng.random() < 0.2:
            study.add_trial(create_trial(state=TrialState.FAIL))
        else:
            study.add_trial(create_trial(values=[rng.choice([1.0, 1.5, 2.0, 2.5, 3.0]),
                                                 rng.choice([10.0, 20.0, 30.0, 40.0])]))
    got = [t.number for t in pareto_front(study.get_trials(deepcopy=False))]
    assert got == sorted(t.number for t in study.best_trials)
    assert got  # a study with a complete trial has a front
