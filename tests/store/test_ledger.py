"""The optuna study is the one ledger: rows ride on its trials, row files and tables are
views rebuilt from it, older results folders are imported, records carry versions."""
import json
import multiprocessing as mp
import shutil

import optuna
import pytest

from hcp_tune.store.records import (
    RECOMMENDATION_COLUMNS,
    Recommendation,
    ResultsTooNew,
    TrialRow,
    Verification,
)
from hcp_tune.store.folder import ResultStore, SweepKey, trial_row
from hcp_tune.store.journals import open_storage
from hcp_tune.store.studies import ROW_PART_CHARS, LayoutStudy, Ledger
from hcp_tune.spec import FailureClass, Status, TrialResult, TrialSpec

PROOF = {"groups": {"match": True}, "numerics": {"passed": True}}
KEY = SweepKey("local", "tiny", 1, 4, 2048, "attention", "default")


def make_row(a2a, median=None, status=Status.OK, key=KEY, n=0, mem=1000, error="", cls=None,
             **extra):
    spec = TrialSpec(trial_id=f"{key.slug}-t{n:03d}-a{a2a}", a2a=a2a, p2p=key.cp // a2a,
                     seq=key.seq, heads=8, kv_heads=8, head_dim=8)
    res = TrialResult(trial_id=spec.trial_id, status=status, verification=PROOF, error=error,
                      failure_class=cls)
    if median is not None:
        res.median_s, res.p10_s, res.p90_s = median, median, median
        res.step_times_s = [median] * 3
        res.peak_mem_bytes = mem
    return trial_row(key, spec, res, **extra)


@pytest.fixture(params=["journal", "sqlite"])
def storage_url(request, tmp_path):
    if request.param == "journal":
        return str(tmp_path / "res" / "optuna.journal")
    return f"sqlite:///{tmp_path}/optuna.db"


def told(storage, key, rows):
    """Ask and tell each row as a sweep does: row file first, then the study."""
    store = ResultStore(storage["root"]) if storage.get("root") else None
    study = LayoutStudy(open_storage(storage["url"]), key.name, [1, 2, 4])
    numbers = []
    for r in rows:
        number, trial_id, _ = study.ask(r["a2a"], key.slug)
        r["trial_id"] = trial_id
        if store:
            store.add(r, key)
        study.tell(number, Status(r["status"]), None, row=r)
        numbers.append(number)
    return study, numbers


def test_tell_stores_the_row_on_the_trial_with_its_state_and_values(tmp_path, storage_url):
    rows = [make_row(1, 2.0, mem=300), make_row(2, 1.5, status=Status.PRUNED),
            make_row(4, status=Status.FAILED, cls=FailureClass.OOM, error="CUDA out of memory"),
            make_row(4, status=Status.CANCELLED, error="cancelled by the user (Ctrl-C)")]
    study, numbers = told({"url": storage_url, "root": tmp_path / "res"}, KEY, rows)
    trials = {t.number: t for t in study.study.get_trials()}
    ok, pruned, failed, cancelled = (trials[n] for n in numbers)
    assert ok.state.name == "COMPLETE" and ok.values == [2.0, 300.0]
    assert pruned.state.name == "PRUNED" and pruned.user_attrs["status"] == "pruned"
    assert failed.state.name == "FAIL" and failed.user_attrs["failure_class"] == "oom"
    assert failed.user_attrs["error"] == "CUDA out of memory"
    assert cancelled.state.name == "FAIL" and cancelled.user_attrs["status"] == "cancelled"
    assert ok.user_attrs["layout"] == "[1,4]"
    held = Ledger(storage_url).rows()
    assert [json.loads(held[(KEY.name, r["trial_id"])]) for r in rows] == rows


def test_rebuild_restores_deleted_row_files_and_tables_byte_for_byte(tmp_path, storage_url):
    root = tmp_path / "res"
    rows = [make_row(1, 2.0, n=0), make_row(2, 1.0, n=1),
            make_row(4, status=Status.FAILED, cls=FailureClass.COMM, error="x\ny")]
    told({"url": storage_url, "root": root}, KEY, rows)
    skipped = make_row(4, status=Status.SKIPPED, error="predicted 3x slower",
                       predicted_step_s=3.0)
    skipped["trial_id"] = f"{KEY.slug}-skip-a4"
    ResultStore(root).add(skipped, KEY)
    LayoutStudy(open_storage(storage_url), KEY.name, [1, 2, 4]).add_row(skipped)
    store = ResultStore(root, storage_url)
    store.rebuild()
    before = {p.relative_to(root): p.read_bytes() for p in root.rglob("*")
              if p.is_file() and (p.parent.parent.name == "rows" or p.suffix == ".csv")}
    assert len([p for p in before if p.suffix == ".json"]) == 4
    shutil.rmtree(root / "rows")
    for name in ("trials.csv", "recommendations.csv"):
        (root / name).unlink()
    store.rebuild()
    after = {p: (root / p).read_bytes() for p in before}
    assert after == before
    (skip,) = [r for r in store.rows() if r["status"] == "skipped"]
    assert skip["predicted_step_s"] == 3.0
    trial = next(t for t in Ledger(storage_url).study(KEY.name).get_trials()
                 if t.user_attrs["trial_id"] == skipped["trial_id"])
    assert trial.state.name == "PRUNED" and trial.user_attrs["status"] == "skipped"


def test_an_older_folder_of_row_files_is_imported_once(tmp_path):
    root = tmp_path / "res"
    store = ResultStore(root)
    rows = [make_row(1, 2.0, n=0), make_row(2, 1.0, n=1), make_row(4, status=Status.INVALID, n=2)]
    for r in rows:  # the previous version: row files, and no rows in the journal
        store.add(r, KEY)
    store.rebuild()
    store.rebuild()
    study = Ledger(ResultStore(root).ledger()).study(KEY.name)
    trials = study.get_trials()
    assert sorted(t.user_attrs["trial_id"] for t in trials) == sorted(r["trial_id"] for r in rows)
    assert all(t.user_attrs["imported"] for t in trials)
    assert sorted(t.state.name for t in trials) == ["COMPLETE", "COMPLETE", "FAIL"]
    assert store.rows() == rows


def test_a_row_written_just_before_the_orchestrator_died_completes_its_trial(tmp_path):
    root = tmp_path / "res"
    study = LayoutStudy(ResultStore(root).ledger(), KEY.name, [1, 2, 4])
    number, trial_id, _ = study.ask(2, KEY.slug)
    study.submitted(number, "42", "local", "/jobs")
    r = make_row(2, 1.0)
    r["trial_id"] = trial_id
    ResultStore(root).add(r, KEY)  # killed here, before tell
    ResultStore(root).rebuild()
    (t,) = Ledger(ResultStore(root).ledger()).study(KEY.name).get_trials()
    assert t.number == number and t.state.name == "COMPLETE" and t.user_attrs["job_id"] == "42"
    study.tell(number, Status.OK, None, row=r)  # its orchestrator tells late: no second trial
    assert len(Ledger(ResultStore(root).ledger()).study(KEY.name).get_trials()) == 1


def test_a_long_error_and_step_list_survive_an_rdb_storage(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    r = make_row(2, status=Status.FAILED, cls=FailureClass.UNKNOWN,
                 error="Traceback: " + "é" * 10_000)  # non-ASCII: escaped, so longer
    r["step_times_s"] = json.dumps([0.123456789] * 2000)
    study, (n,) = told({"url": url}, KEY, [r])
    trial = study.study.get_trials()[n]
    assert trial.user_attrs["row_parts"] > 1
    # MySQL's TEXT holds 65,535 bytes: no attribute's JSON may exceed it
    assert max(len(json.dumps(v).encode()) for v in trial.user_attrs.values()) <= 65_535
    assert max(len(v) for k, v in trial.user_attrs.items() if k.startswith("row.")) <= ROW_PART_CHARS
    assert json.loads(Ledger(url).rows()[(KEY.name, r["trial_id"])]) == r


def test_the_pareto_column_comes_from_the_study(tmp_path):
    root = tmp_path / "res"
    rows = [make_row(1, 2.0, mem=100), make_row(2, 1.0, mem=500), make_row(4, 3.0, mem=600)]
    told({"url": str(root / "optuna.journal"), "root": root}, KEY, rows)
    ResultStore(root).rebuild()
    (rec,) = ResultStore(root).recommendations()
    assert rec["a2a"] == 2 and rec["pareto"] == "[1,4] [2,2]"  # [4,1] is dominated
    header = (root / "recommendations.csv").read_text().splitlines()[0]
    assert header == ",".join(RECOMMENDATION_COLUMNS)
    assert header.endswith(",pareto,tokens_per_gpu_s,stopped_early,level,schema_version")


def test_trials_whose_memory_was_not_measured_are_never_on_the_pareto_front(tmp_path):
    """CPU trials record no memory (null): told to the study as 0, they would make a
    memory front of a measurement nobody took."""
    root = tmp_path / "res"
    rows = [make_row(1, 2.0, mem=None), make_row(2, 1.0, mem=None), make_row(4, 3.0, mem=None)]
    told({"url": str(root / "optuna.journal"), "root": root}, KEY, rows)
    ResultStore(root).rebuild()
    (rec,) = ResultStore(root).recommendations()
    assert rec["a2a"] == 2 and rec["pareto"] == ""  # still ranked by time; no front


def test_an_ok_trial_without_proof_of_cp_is_never_on_the_pareto_front(tmp_path):
    root = tmp_path / "res"
    unproven = make_row(1, 0.5, mem=50, n=1)  # fastest and smallest, but CP not proven
    unproven["verified"] = False
    told({"url": str(root / "optuna.journal"), "root": root}, KEY,
         [unproven, make_row(2, 1.0, mem=500, n=2)])
    ResultStore(root).rebuild()
    (rec,) = ResultStore(root).recommendations()
    assert rec["a2a"] == 2 and rec["pareto"] == "[2,2]"


def _teller(url, key_seq, count):
    key = SweepKey("local", "tiny", 1, 4, key_seq, "attention", "default")
    told({"url": url}, key, [make_row(2, 1.0 + i / 100, key=key) for i in range(count)])


def test_two_processes_telling_into_one_journal_lose_nothing(tmp_path):
    url = str(tmp_path / "optuna.journal")
    ctx = mp.get_context("spawn")
    # two keys, and two writers on one key
    procs = [ctx.Process(target=_teller, args=(url, seq, 12)) for seq in (2048, 2048, 4096)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    held = Ledger(url).rows()
    assert len(held) == 36
    assert sorted(n.split("|")[-3] for n, _ in held) == ["seq=2048"] * 24 + ["seq=4096"] * 12


def test_a_keys_rows_are_selected_by_its_fields(tmp_path):
    store = ResultStore(tmp_path)
    other = SweepKey("local", "tiny", 1, 4, 4096, "attention", "default")
    mine = make_row(2, 1.0, n=0)
    theirs = make_row(2, 1.0, key=other, n=1)
    theirs["trial_id"] = f"{KEY.slug}-t999-a2"  # an id that looks like ours selects nothing
    store.add(mine, KEY)
    store.add(theirs, other)
    assert [r["trial_id"] for r in store.key_rows(KEY)] == [mine["trial_id"]]
    assert [r["seq"] for r in store.key_rows(other)] == [4096]
    assert KEY.holds({**mine, "pp": 1}) and not KEY.holds({**mine, "pp": 2})


def test_records_of_a_newer_version_are_refused_and_older_ones_read():
    rec = {k: 1 for k in RECOMMENDATION_COLUMNS}
    del rec["pareto"], rec["schema_version"]  # a table written before the column
    assert Recommendation.from_dict(rec).pareto == ""
    with pytest.raises(ResultsTooNew, match=r"^t.csv: recommendation schema 3 > 2, .* upgrade "
                                            r"hcp-tune, or use another results_dir$"):
        Recommendation.from_dict({**rec, "schema_version": 3}, where="t.csv")
    with pytest.raises(ResultsTooNew, match="verification schema 7 > 1"):
        Verification.from_dict({**PROOF, "schema_version": 7})
    assert Verification.from_dict(PROOF).verified
    assert not Verification.from_dict({"groups": {"match": True}}).verified
    bridge = {"cp_active": {"checked": True, "problems": ["module 3: cp group [0]"]}}
    assert not Verification.from_dict(bridge).verified
    assert Verification.from_dict(Verification.from_dict(bridge).to_dict()) == \
        Verification.from_dict(bridge)
    row = make_row(2, 1.0, predicted_step_s=2.0)
    assert TrialRow.from_dict(row).to_dict() == row
    with pytest.raises(ResultsTooNew, match="row schema 3 > 1"):
        TrialRow.from_dict({**row, "schema_version": 3})


def test_a_newer_row_in_the_study_is_refused_by_rebuild(tmp_path):
    root = tmp_path / "res"
    told({"url": str(root / "optuna.journal")}, KEY, [{**make_row(2, 1.0), "schema_version": 5}])
    with pytest.raises(ResultsTooNew, match="row schema 5 > 1"):
        ResultStore(root).rebuild()


def test_optuna_sees_a_plain_study_per_key(tmp_path):
    url = str(tmp_path / "optuna.journal")
    told({"url": url}, KEY, [make_row(2, 1.0)])
    names = optuna.get_all_study_names(open_storage(url))
    assert names == [KEY.name]


def test_an_older_folder_with_its_job_id_journal_is_imported_without_doubling_the_front(tmp_path):
    """The previous version told the study only states and values, beside the row files."""
    root = tmp_path / "res"
    study = LayoutStudy(ResultStore(root).ledger(), KEY.name, [1, 2, 4])
    for r in (make_row(1, 2.0, mem=100), make_row(2, 1.0, mem=500), make_row(4, 3.0, mem=600)):
        number, r["trial_id"], _ = study.ask(r["a2a"], KEY.slug)
        study.submitted(number, "7", "local", "/jobs")
        ResultStore(root).add(r, KEY)
        study.tell(number, Status.OK, (r["median_s"], float(r["peak_mem_bytes"])))
    for _ in range(2):
        ResultStore(root).rebuild()
    trials = Ledger(ResultStore(root).ledger()).study(KEY.name).get_trials()
    assert len(trials) == 6 and sum(bool(t.user_attrs.get("imported")) for t in trials) == 3
    (rec,) = ResultStore(root).recommendations()
    assert rec["pareto"] == "[1,4] [2,2]"


def test_a_recommendations_table_of_the_previous_version_is_read(tmp_path):
    old_columns = [c for c in RECOMMENDATION_COLUMNS if c not in ("pareto", "schema_version")]
    values = {**{c: "" for c in old_columns}, "cluster": "local", "model": "tiny", "tp": "1",
              "pp": "1", "cp": "4", "seq": "2048", "runner": "attention", "env_tag": "default",
              "a2a": "2", "p2p": "2", "comm_type": "a2a+p2p", "median_s": "1.5",
              "trials": "2", "ok_trials": "2", "tie": "False", "incomplete": "False"}
    (tmp_path / "recommendations.csv").write_text(
        ",".join(old_columns) + "\n" + ",".join(values[c] for c in old_columns) + "\n")
    (rec,) = ResultStore(tmp_path).recommendations()
    assert (rec["a2a"], rec["median_s"], rec["pareto"], rec["schema_version"]) == (2, 1.5, "", 2)
    newer = (tmp_path / "recommendations.csv").read_text().splitlines()
    (tmp_path / "recommendations.csv").write_text(
        newer[0] + ",schema_version\n" + newer[1] + ",3\n")
    with pytest.raises(ResultsTooNew, match="recommendations.csv: recommendation schema 3 > 2"):
        ResultStore(tmp_path).recommendations()


def test_a_ctrl_c_inside_a_journal_append_is_held_until_the_append_is_whole(tmp_path, monkeypatch):
    """CI, 2026-12-07: Ctrl-C landed while optuna held a journal's lock file; its release
    then raised FileNotFoundError over the KeyboardInterrupt and the sweep died with a
    traceback. The journal's appends hold the SIGINT: the append ends whole (its lock
    file gone), then KeyboardInterrupt, as Ctrl-C gives anywhere else."""
    import os
    import signal

    import optuna
    from optuna.storages.journal import JournalFileBackend

    from hcp_tune.store import journals

    real = JournalFileBackend.append_logs

    def ctrl_c_inside(self, logs):
        os.kill(os.getpid(), signal.SIGINT)  # pressed while the append runs
        real(self, logs)

    monkeypatch.setattr(JournalFileBackend, "append_logs", ctrl_c_inside)
    path = tmp_path / "k.journal"
    with pytest.raises(KeyboardInterrupt):
        optuna.create_study(storage=journals.journal_storage(path), study_name="s")
    monkeypatch.undo()
    names = [st.study_name for st in journals.journal_storage(path).get_all_studies()]
    assert names == ["s"] and sorted(p.name for p in tmp_path.iterdir()) == ["k.journal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

