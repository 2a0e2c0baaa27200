"""PostgreSQL as a team's ledger, against a real server (scripts/postgres-local.sh, started
by the ``postgres_server`` fixture): two folders writing one key at once get one ranking;
a third, empty folder sees every trial; sync is incremental; migrate moves a journal folder
once; a refused login or an unreachable host is one line, exit 2, nothing written."""
import json
import os
import multiprocessing as mp
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from hcp_tune.store import journals, rdb, studies
from hcp_tune.store.folder import ResultStore

sys.path.insert(0, str(Path(__file__).parent))
from helpers import REPO, TINY, hcp, rows, start, wait_for  # noqa: E402
from test_store import KEY, row  # noqa: E402

pytestmark = pytest.mark.postgres


def _sweep_like(root: str, url: str, who: str, count: int) -> None:
    """What a sweep does for each trial, from its own folder: ask the shared study, write
    the row file, tell the study, rebuild the folder's tables."""
    store = ResultStore(root, url)
    storage = store.ledger(url)
    study = studies.LayoutStudy(storage, KEY.name, [1, 2, 4])
    for i in range(count):
        number, trial_id, a2a = study.ask([1, 2, 4][i % 3], who)
        r = row(a2a, 1.0 + a2a / 10 + i / 1000, n=i)
        r["trial_id"] = trial_id
        store.add(r, KEY)
        study.tell(number, None, None, row=r)
        store.rebuild(storage)


def _tell(url: str, who: str, count: int, start: int = 0) -> None:
    _sweep_like(f"/nonexistent-{who}", url, who, 0)  # (the study exists)
    storage = journals.open_storage(url)
    study = studies.LayoutStudy(storage, KEY.name, [1, 2, 4])
    for i in range(start, start + count):
        number, trial_id, a2a = study.ask(2, who)
        r = row(a2a, 1.0 + i / 1000, n=i)
        r["trial_id"] = trial_id
        study.tell(number, None, None, row=r)


def test_two_folders_at_once_get_one_ranking_and_an_empty_third_sees_all(postgres_db, tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_sweep_like, args=(str(tmp_path / who), postgres_db, who, 6))
             for who in ("alice", "bob")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
        assert p.exitcode == 0
    for who in ("alice", "bob"):  # each folder, synced, holds both users' trials
        ResultStore(tmp_path / who).refresh()  # (it remembers its database)
        trials = pd.read_csv(tmp_path / who / "trials.csv")
        assert sorted({t.split("-")[0] for t in trials["trial_id"]}) == ["alice", "bob"]
        assert len(trials) == 12
    ranked = [(tmp_path / w / "recommendations.csv").read_text() for w in ("alice", "bob")]
    assert ranked[0] == ranked[1]  # one ranking
    third = tmp_path / "carol"
    r = hcp("results", "sync", f"results_dir={third}", f"search.storage={postgres_db}")
    assert r.returncode == 0, r.stderr
    assert "trials.csv holds 12 trial(s)" in r.stdout
    (rec,) = ResultStore(third).recommendations()
    assert rec["trials"] == 12 and rec["ok_trials"] == 12


def test_sync_derives_only_the_keys_that_changed(postgres_db, tmp_path):
    other = dict(KEY.__dict__, env_tag="other")
    _tell(postgres_db, "alice", 3)
    storage = journals.open_storage(postgres_db)
    studies.LayoutStudy(storage, type(KEY)(**other).name, [2]).add_row(
        {**row(2, 1.5, key=type(KEY)(**other)), "trial_id": "o-1"})
    store = ResultStore(tmp_path, postgres_db)
    store.rebuild()
    index = json.loads((tmp_path / ".tables.json").read_text())
    assert index["ledger"] == postgres_db and len(index["slugs"]) == 2
    for folder in (tmp_path / "rows").iterdir():  # written long ago: past the time a file
        os.utime(folder, (1e9, 1e9))  # system's coarse clock could still hide a write in
    store.rebuild()
    _tell(postgres_db, "bob", 2, start=3)  # 2 new trials of KEY only
    calls = []
    real = store._derive
    store._derive = lambda ledger, slugs: calls.append(slugs) or real(ledger, slugs)
    store.rebuild()
    assert calls == [{KEY.slug}]  # the other key's lines were copied, not derived
    assert len(pd.read_csv(tmp_path / "trials.csv")) == 6
    os.utime(tmp_path / "rows" / KEY.slug, (1e9, 1e9))
    store.rebuild()  # settles the time the new row files gave the key's folder
    store.rebuild()
    assert calls[-1] == set()  # nothing changed: nothing derived
    before = (tmp_path / "trials.csv").read_bytes()
    ResultStore(tmp_path).rebuild_all(postgres_db)
    assert (tmp_path / "trials.csv").read_bytes() == before  # incremental == from scratch


def test_a_user_attribute_added_later_marks_its_key_changed(postgres_db, tmp_path):
    """A row told to a RUNNING trial changes no trial count: the attribute mark sees it."""
    storage = journals.open_storage(postgres_db)
    study = studies.LayoutStudy(storage, KEY.name, [2])
    number, trial_id, _ = study.ask(2, "alice")
    store = ResultStore(tmp_path, postgres_db)
    store.rebuild()
    assert len(pd.read_csv(tmp_path / "trials.csv")) == 0
    r = {**row(2, 1.0), "trial_id": trial_id}
    inner = rdb.backend(storage)
    tid = inner.get_trial_id_from_study_id_trial_number(study.study._study_id, number)
    for k, v in studies.row_attrs(r).items():  # the row, not yet the state (as tell does)
        inner.set_trial_user_attr(tid, k, v)
    store.rebuild()
    assert list(pd.read_csv(tmp_path / "trials.csv")["trial_id"]) == [trial_id]


def test_migrate_moves_a_journal_folder_once_with_a_count_check(postgres_db, tmp_path):
    folder = tmp_path / "journal-folder"
    store = ResultStore(folder)
    for n in range(4):
        store.add(row(2, 1.0 + n / 10, n=n), KEY)
    store.rebuild()  # into journals/
    assert (folder / "journals").is_dir()
    r = hcp("results", "migrate", f"results_dir={folder}", f"search.storage={postgres_db}")
    assert r.returncode == 0, r.stderr
    assert "1 studies migrated" in r.stdout and "4 trial(s) copied, 0 already there" in r.stdout
    r = hcp("results", "migrate", f"results_dir={folder}", f"storage={postgres_db}")  # old name
    assert r.returncode == 0, r.stderr
    assert "0 trial(s) copied, 4 already there" in r.stdout  # twice adds nothing
    held = studies.Ledger(journals.open_storage(postgres_db)).rows()
    assert len(held) == 4
    third = tmp_path / "empty"
    assert hcp("results", "sync", f"results_dir={third}", f"search.storage='{postgres_db}'"
               ).returncode == 0  # quoted as for sweep: the same URL
    assert (third / "trials.csv").read_text() == (folder / "trials.csv").read_text()


@pytest.mark.parametrize("where", ["wrong password", "unreachable host", "query string"])
def test_a_database_that_cannot_be_used_is_one_line_exit_2_nothing_written(
        postgres_server, tmp_path, where):
    port = postgres_server.rpartition("port=")[2]  # the script's server, over TCP
    url = {"wrong password": f"postgresql://hcp:wrong@127.0.0.1:{port}/hcp",
           "unreachable host": "postgresql://hcp:x@127.0.0.1:1/hcp",  # nothing on port 1
           # as a team writes it, unquoted: reaches the driver, which refuses the login
           "query string": f"postgresql://hcp:wrong@127.0.0.1:{port}/hcp?sslmode=disable"
                           "&connect_timeout=3"}[where]
    res = tmp_path / "results"
    r = hcp("sweep", "cp=2", "seq=1024", *TINY, "executor=local", f"results_dir={res}",
            f"search.storage={url}")
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "cannot use the database" in line and "wrong" not in line  # no password shown
    assert ("Connection refused" if where == "unreachable host"
            else "password authentication failed") in line
    assert not res.exists()
    r = hcp("results", "sync", f"results_dir={res}", f"search.storage={url}")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert not res.exists()


def test_a_lost_connection_is_retried_then_stops_with_what_to_rerun(postgres_db, monkeypatch):
    """The server restarted under a call: retried with backoff (here: the first try fails
    as a dropped connection does), and past the retry period one line says what to do."""
    from sqlalchemy import exc

    storage = rdb.open_storage(postgres_db)
    real = type(storage).__mro__[1].get_all_studies
    fails = {"n": 1}

    def flaky(self):
        if fails["n"] > 0:
            fails["n"] -= 1
            raise exc.OperationalError("SELECT", {}, Exception("server closed the connection"))
        return real(self)

    monkeypatch.setattr(type(storage).__mro__[1], "get_all_studies", flaky)
    monkeypatch.setattr(rdb, "BACKOFF_S", (0.01, 0.01))
    assert storage.get_all_studies() == []  # retried once, then answered
    fails["n"] = 10**6
    monkeypatch.setenv("HCP_TUNE_DB_RETRY_S", "0.05")
    with pytest.raises(rdb.LedgerUnavailable, match="re-run the same command"):
        storage.get_all_studies()
    bad = exc.ProgrammingError("SELECT", {}, Exception("syntax error"))

    def broken(self):
        raise bad

    monkeypatch.setattr(type(storage).__mro__[1], "get_all_studies", broken)
    with pytest.raises(exc.ProgrammingError):  # a bad statement is not retried
        storage.get_all_studies()


def test_a_server_restarted_mid_sweep_loses_nothing(postgres_server, postgres_db, tmp_path):
    """A real restart (scripts/postgres-local.sh restart: every session cut) between two tells: the
    next call reconnects (pool_pre_ping) and every trial is there."""
    storage = journals.open_storage(postgres_db)
    study = studies.LayoutStudy(storage, KEY.name, [2])
    n1, t1, _ = study.ask(2, "alice")
    study.tell(n1, None, None, row={**row(2, 1.0, n=1), "trial_id": t1})
    restart = subprocess.run([str(REPO / "scripts" / "postgres-local.sh"), "restart"],
                             capture_output=True, text=True, timeout=120)
    assert restart.returncode == 0, restart.stderr
    n2, t2, _ = study.ask(2, "alice")
    study.tell(n2, None, None, row={**row(2, 1.1, n=2), "trial_id": t2})
    ResultStore(tmp_path, postgres_db).rebuild()
    assert sorted(pd.read_csv(tmp_path / "trials.csv")["trial_id"]) == sorted([t1, t2])


def test_two_sweeps_of_one_key_at_once_and_recommend_from_a_third_folder(postgres_db, tmp_path):
    """The issue's acceptance: two real sweeps (local executor) of the same key from two
    folders at once, into one database; recommend from a third, empty folder counts every
    ok trial of both."""
    storage = f"search.storage='{postgres_db}'"  # quoted: Hydra reads '=' and '&' in a URL
    args = ["sweep", "cp=2", "seq=1024", *TINY, "executor=local", storage]
    procs = [start(*args, f"results_dir={tmp_path / who}") for who in ("alice", "bob")]
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out
    r = hcp("recommend", "cp=2", "seq=1024", *TINY, f"results_dir={tmp_path / 'carol'}",
            storage, "format=json")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)["recommendation"]
    assert rec["trials"] == 4 and rec["ok_trials"] == 4  # both layouts, from both sweeps
    ids = set(pd.read_csv(tmp_path / "carol" / "trials.csv")["trial_id"])
    for who in ("alice", "bob"):
        assert set(pd.read_csv(tmp_path / who / "trials.csv")["trial_id"]) <= ids


def test_a_killed_sweep_given_a_password_leaves_it_in_no_file(postgres_server, postgres_db,
                                                              tmp_path):
    """The password typed in search.storage (a URL with a query string, unquoted) is in no
    file of the folder, neither after a sweep killed with SIGKILL (its marker stays) nor
    after the sweep that resumes it, which removes the dead sweep's marker."""
    port = postgres_server.rpartition("port=")[2]
    name = postgres_db.partition("/t_")[2].partition("?")[0]
    url = f"postgresql://hcp:hcp-local@127.0.0.1:{port}/t_{name}?sslmode=disable"
    res = tmp_path / "results"
    # 3 trials a layout, all planned at once: the kill after the first stored trial finds
    # the sweep still running (with one trial a layout it could end before the kill)
    args = ["sweep", "cp=2", "seq=1024", *TINY, "executor=local", f"results_dir={res}",
            f"search.storage={url}", "search.repeats=3", "search.adaptive=false"]

    def files_with_password() -> list[str]:
        return [str(p) for p in res.rglob("*") if p.is_file() and b"hcp-local" in p.read_bytes()]

    proc = start(*args)
    wait_for(lambda: rows(res), what="the first stored trial")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    (dead,) = (res / "sweeps").glob("*.running")  # what a killed sweep leaves
    assert files_with_password() == []
    r = hcp(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(rows(res)) == 6 and not dead.exists() and not list(res.glob("sweeps/*.running"))
    assert files_with_password() == []
    assert json.loads((res / ".ledger.json").read_text())["storage"] == url.replace(
        ":hcp-local@", "@")
