"""Result storage: atomic rows, derived tables, ranking, ties, concurrent writers."""
import dataclasses
import multiprocessing as mp

import pandas as pd
import pytest

from hcp_tune.store.folder import (
    RECOMMENDATION_COLUMNS,
    TRIAL_COLUMNS,
    ResultsTooNew,
    ResultStore,
    SweepKey,
    recommendations,
    trial_row,
)
from hcp_tune.spec import FailureClass, Status, TrialResult, TrialSpec

PROOF = {"groups": {"match": True}, "numerics": {"passed": True}}
KEY = SweepKey("local", "tiny", 1, 4, 2048, "attention", "default")


def row(a2a, median, spread=0.0, status=Status.OK, key=KEY, n=0, mem=1000):
    spec = TrialSpec(trial_id=f"{key.slug}-t{n:03d}-a{a2a}", a2a=a2a, p2p=key.cp // a2a,
                     seq=key.seq, heads=8, kv_heads=8, head_dim=8)
    res = TrialResult(trial_id=spec.trial_id, status=status, verification=PROOF)
    if median is not None:
        res.median_s, res.p10_s, res.p90_s = median, median * (1 - spread), median * (1 + spread)
        res.step_times_s = [median] * 3
        res.peak_mem_bytes = mem
    if status is Status.FAILED:
        res.failure_class, res.error = FailureClass.OOM, "CUDA out of memory"
    return trial_row(key, spec, res)


def test_best_runner_up_margin_and_speedups():
    rows = [row(1, 2.0, n=0), row(2, 1.0, n=1), row(4, 1.5, n=2)]
    (rec,) = recommendations(rows)
    assert (rec["a2a"], rec["p2p"], rec["comm_type"]) == (2, 2, "a2a+p2p")
    assert rec["runner_up"] == "[4,1]" and rec["margin"] == pytest.approx(0.5)
    assert rec["speedup_vs_p2p"] == pytest.approx(2.0)
    assert rec["speedup_vs_a2a"] == pytest.approx(1.5)
    assert rec["tie"] is False and rec["trials"] == 3


def test_a_tie_is_the_ratio_interval_inside_the_threshold_not_one_trials_noise():
    """Issue 28: one trial's p10-p90 (5% here) no longer makes a 3% margin a tie; the
    ratio of the layouts' figures, over their trials, does."""
    one_each = [row(2, 1.00, spread=0.05, n=0), row(4, 1.03, spread=0.05, n=1)]
    (rec,) = recommendations(one_each)
    assert rec["tie"] is False and rec["verdict"] == "unsettled"
    close = [row(2, m, n=i) for i, m in enumerate((1.000, 1.004, 0.998))] + \
        [row(4, m, n=3 + i) for i, m in enumerate((1.003, 1.006, 1.001))]
    (rec,) = recommendations(close)
    assert rec["verdict"] == "tie" and rec["tie"] is True
    assert rec["tied"] == "[2,2] [4,1]" and rec["lighter"] in ("[2,2]", "[4,1]")


def test_failed_and_invalid_trials_are_never_ranked():
    rows = [row(1, 0.1, status=Status.INVALID, n=0), row(2, None, status=Status.FAILED, n=1),
            row(4, 1.0, n=2)]
    (rec,) = recommendations(rows)
    assert rec["a2a"] == 4 and rec["trials"] == 3 and rec["ok_trials"] == 1
    assert recommendations([row(1, 0.1, status=Status.INVALID)]) == []


def test_an_ok_row_without_proof_of_cp_is_not_ranked():
    unproven = row(2, 0.5, n=0)
    unproven["verified"] = False
    (rec,) = recommendations([unproven, row(4, 1.0, n=1)])
    assert rec["a2a"] == 4


def test_rows_are_files_and_tables_are_rebuilt(tmp_path):
    store = ResultStore(tmp_path)
    for r in (row(1, 2.0, n=0), row(2, 1.0, n=1)):
        store.add(r, KEY)
    t_path, r_path = store.rebuild()
    trials = pd.read_csv(t_path)
    assert sorted(trials["a2a"]) == [1, 2]
    assert store.recommendations()[0]["a2a"] == 2
    assert not list(tmp_path.rglob(".tmp-*"))  # no temp files left behind


def test_a_row_write_a_kill_left_unrenamed_is_no_row(tmp_path):
    """SIGKILL between a row's fsync and its rename leaves a whole ``.tmp-*`` copy beside
    the row (CI, 2026-12-07: a killed sweep's folder held 7 files for 6 trials); it is read
    nowhere: not as a row, a key's row, a key of the folder, nor a trial of ``results``."""
    from hcp_tune.outputs import folder

    store = ResultStore(tmp_path)
    store.add(row(2, 1.0, n=0), KEY)
    path = store.row_path(KEY, row(2, 1.0, n=0)["trial_id"])
    path.with_name(f".tmp-x1y2z3{path.name}").write_text(path.read_text())
    other = SweepKey("local", "tiny", 1, 4, 4096, "attention", "default")
    (tmp_path / "rows" / other.slug).mkdir()
    (tmp_path / "rows" / other.slug / f".tmp-a1b2c3{other.slug}-t000-a2.json").write_text(
        path.read_text().replace('"seq": 2048', '"seq": 4096'))
    assert len(store.rows()) == len(store.key_rows(KEY)) == 1
    assert list(store.folder_keys()) == [KEY.slug]
    doc = folder.summarize(tmp_path)
    assert [t["trials"] for t in doc["tags"]] == [1]
    assert len(pd.read_csv(store.rebuild()[0])) == 1


def test_tables_have_their_header_even_when_nothing_was_stored_or_ranked(tmp_path):
    """Issue 8 §4.2: a sweep whose trials all failed wrote a recommendations.csv with no
    header; an empty store wrote two empty files."""
    store = ResultStore(tmp_path)
    t_path, r_path = store.rebuild()
    assert t_path.read_text().strip() == ",".join(TRIAL_COLUMNS)
    assert r_path.read_text().strip() == ",".join(RECOMMENDATION_COLUMNS)
    store.add(row(2, None, status=Status.FAILED), KEY)
    store.rebuild()
    assert list(pd.read_csv(t_path)["failure_class"]) == ["oom"]
    assert r_path.read_text().strip() == ",".join(RECOMMENDATION_COLUMNS)
    assert store.recommendations() == []


def test_the_declared_columns_are_what_rows_and_recommendations_hold():
    assert tuple(row(2, 1.0)) == TRIAL_COLUMNS
    (rec,) = recommendations([row(2, 1.0)])
    assert tuple(rec) == RECOMMENDATION_COLUMNS


def _writer(root, offset, count):
    store = ResultStore(root)
    key = SweepKey("local", "tiny", 1, 4, 2048 * (offset + 1), "attention", "default")
    for i in range(count):
        store.add(row(2, 1.0 + i / 100, key=key, n=i), key)
        store.rebuild()


def test_two_sweeps_writing_one_folder_corrupt_nothing(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), k, 15)) for k in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    ResultStore(tmp_path).rebuild()
    trials = pd.read_csv(tmp_path / "trials.csv")
    assert len(trials) == 30
    recs = pd.read_csv(tmp_path / "recommendations.csv")
    assert sorted(recs["seq"]) == [2048, 4096]


def test_a_measured_best_that_would_not_fit_is_never_recommended():
    from hcp_tune.outputs.recommend import unfit_reason

    rec = {"a2a": 2, "p2p": 4, "peak_mem_bytes": 90 * 1024**3}
    assert unfit_reason(rec, [], 80) == "[2,4] measured 90.0 GiB peak > 80 GiB per GPU"
    rec["peak_mem_bytes"] = 10 * 1024**3
    assert unfit_reason(rec, [], 80) is None
    pred = [{"a2a": 2, "p2p": 4, "fits_memory": False, "predicted_memory_gib": 132.5}]
    assert unfit_reason(rec, pred, 80) == (
        "[2,4] is predicted to need 132.5 GiB per GPU in training > 80 GiB")
    pred[0]["fits_memory"] = True
    assert unfit_reason(rec, pred, 80) is None


def _same_key_by_text(rows, rec):
    """The selection ``regress.same_key`` made before ``store.key_rows`` replaced it: every
    key field compared as text, pp=1 for a record without one (kept here as the oracle)."""
    fields = ("cluster", "model", "tp", "pp", "cp", "seq", "runner", "env_tag")
    default = {"pp": 1}
    return [r for r in rows if all(str(r.get(k, default.get(k))) == str(rec.get(k, default.get(k)))
                                   for k in fields)]


def test_key_rows_selects_what_the_text_comparison_selected(tmp_path):
    """recommend's injected-delay check now selects a recommendation's rows with the one
    ``key_rows``: on recommendations read back from recommendations.csv (pandas' types) and
    rows with and without pp, it selects exactly what the old text comparison did."""
    from hcp_tune.store.folder import SweepKey, key_rows

    store = ResultStore(tmp_path)
    keys = [SweepKey(cluster="local", model="tiny", tp=tp, cp=2, seq=seq, runner="attention",
                     env_tag=tag, pp=pp)
            for tp in (1, 2) for seq in (256, 512) for tag in ("a", "b") for pp in (1, 2)]
    for i, key in enumerate(keys):
        for a2a in (1, 2):
            spec = TrialSpec(trial_id=f"{key.slug}-t{i:03d}-a{a2a}", a2a=a2a, p2p=2 // a2a,
                             tp=key.tp, seq=key.seq, heads=8, kv_heads=8, head_dim=8)
            res = TrialResult(trial_id=spec.trial_id, status=Status.OK, median_s=0.1 * a2a,
                              step_times_s=[0.1 * a2a] * 3, p10_s=0.1, p90_s=0.1,
                              verification={"groups": {"match": True},
                                            "numerics": {"passed": True}})
            store.add(trial_row(key, spec, res), key)
    store.rebuild()
    rows = store.rows()
    old = [dict(r) for r in rows[:4]]
    for r in old:  # rows stored before pp joined the key
        del r["pp"]
    recs = store.recommendations()
    assert len(recs) == len(keys)
    for rec in recs:
        for pool in (rows, rows + old):
            assert key_rows(pool, SweepKey.of(rec)) == _same_key_by_text(pool, rec)


def test_a_keys_rows_are_read_from_its_folder_alone(tmp_path):
    """``ResultStore.key_rows`` reads only ``rows/<slug>/`` (what resume planning and
    recommend cost no longer grows with the folder) and selects what the whole-folder
    selection does, an older row without pp included."""
    import json

    store = ResultStore(tmp_path)
    keys = [SweepKey("local", "tiny", 1, 4, seq, "attention", tag, pp=pp)
            for seq in (1024, 2048) for tag in ("a", "b") for pp in (1, 2)]
    for i, key in enumerate(keys):
        for a2a in (1, 2, 4):
            store.add(row(a2a, 1.0 + a2a, key=key, n=i), key)
    older = row(2, 3.0, key=keys[0], n=99)
    del older["pp"]  # written before pp joined the key: filed under the same slug
    path = store.row_path(keys[0], older["trial_id"])
    path.write_text(json.dumps(older))
    every = store.rows()
    for key in keys:
        mine = store.key_rows(key)
        assert mine == [r for r in every if key.holds(r)]
        assert len(mine) == (4 if key == keys[0] else 3)
    # a row another key's folder holds is never opened: a newer hcp-tune's row there does
    # not stop this key's reader (the whole-folder reader refuses it)
    newer = row(1, 1.0, key=keys[1], n=50)
    store.row_path(keys[1], newer["trial_id"]).write_text(
        json.dumps({**newer, "schema_version": 99}))
    assert len(store.key_rows(keys[0])) == 4
    with pytest.raises(ResultsTooNew, match="schema 99"):
        store.rows()


def test_a_tags_rows_are_read_from_its_keys_folders_alone(tmp_path):
    """``ResultStore.tag_rows`` (report env_tag=X, regress) selects what filtering every row
    by tag selects, in the same order, and never opens another tag's folder."""
    import json

    store = ResultStore(tmp_path)
    keys = [SweepKey("local", "tiny", tp, 4, seq, "attention", tag)
            for tag in ("night-1", "night-2", "night-3") for tp in (1, 2) for seq in (1024, 2048)]
    for i, key in enumerate(keys):
        for a2a in (1, 2, 4):
            store.add(row(a2a, 1.0 + a2a, key=key, n=i), key)
    store.row_path(keys[0], "zz-damaged").write_text("{not json")  # a damaged file
    every = store.rows()
    for tags in ({"night-1"}, {"night-2", "night-3"}, {"nope"}):
        assert store.tag_rows(tags) == [r for r in every if r["env_tag"] in tags]
    assert {k.env_tag for k in store.folder_keys().values()} == {"night-1", "night-2", "night-3"}
    newer = row(1, 1.0, key=keys[-1], n=50)  # night-3
    store.row_path(keys[-1], newer["trial_id"]).write_text(
        json.dumps({**newer, "schema_version": 99}))
    assert len(store.tag_rows({"night-1"})) == 12
    with pytest.raises(ResultsTooNew, match="schema 99"):
        store.tag_rows({"night-3"})


def test_dp_mbs_and_micro_batches_join_the_key_and_older_rows_read_as_1():
    """issue 19: keys that differ in dp, mbs or m are never mixed (resume, recommend,
    regress all select through SweepKey.holds); a row stored before has none of them."""
    old = {"cluster": "local", "model": "tiny", "tp": 1, "cp": 4, "seq": 2048,
           "runner": "attention", "env_tag": "default"}
    base = SweepKey("local", "tiny", 1, 4, 2048, "attention", "default")
    assert base.holds(old) and base.name == "|".join(f"{k}={v}" for k, v in old.items()
                                                     if k != "env_tag") + "|env_tag=default"
    for change in ({"dp": 2}, {"mbs": 2}, {"micro_batches": 8}):
        other = dataclasses.replace(base, **change)
        assert not other.holds(old) and other.holds({**old, **change})
        assert other.slug != base.slug
    assert SweepKey.of(old) == base


@pytest.mark.parametrize("mask, want", [(0o022, 0o644), (0o077, 0o600)])
def test_outputs_honour_the_umask(tmp_path, mask, want):
    """Teammates on a shared file system read the results: every output gets the mode
    open() would give it (mkstemp alone made them 0600 under any umask)."""
    import os
    import stat

    old = os.umask(mask)
    try:
        store = ResultStore(tmp_path)
        store.add(row(2, 1.0), KEY)
        store.rebuild()
    finally:
        os.umask(old)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != ".lock"]
    assert (tmp_path / "trials.csv") in written and (tmp_path / "recommendations.csv") in written
    for path in written:
        if "journals" in path.parts:  # optuna's own journal
            continue
        assert stat.S_IMODE(path.stat().st_mode) == want, path
