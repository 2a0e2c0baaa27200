"""The ledger is one journal per sweep key, and the end-of-sweep update derives only the
keys that changed: what it writes equals a full rebuild, byte for byte, after random
sequences of sweeps, concurrent sweeps and a sweep killed with SIGKILL; an older folder's
single journal is split once."""
import json
import multiprocessing as mp
import os
import random
import shutil
import signal

import pytest

from hcp_tune.store import journals
from hcp_tune.store.folder import ResultStore, SweepKey, csv_line, trial_row
from hcp_tune.store.journals import open_storage
from hcp_tune.store.studies import LayoutStudy, Ledger
from hcp_tune.spec import FailureClass, Status, TrialResult, TrialSpec

PROOF = {"groups": {"match": True}, "numerics": {"passed": True}}
KEYS = [SweepKey("local", "tiny", tp, 4, seq, "attention", tag)
        for tag in ("night-1", "night-2", "night-3") for tp in (1, 2) for seq in (2048, 4096)]


def row_for(key, a2a, n, rnd, extra=False):
    spec = TrialSpec(trial_id=f"{key.slug}-t{n:03d}-a{a2a}", a2a=a2a, p2p=key.cp // a2a,
                     seq=key.seq, heads=8, kv_heads=8, head_dim=8)
    kind = rnd.random()
    res = TrialResult(trial_id=spec.trial_id, status=Status.OK, verification=PROOF)
    if kind < 0.15:
        res.status, res.failure_class, res.error = Status.FAILED, FailureClass.OOM, "a,\"b\"\nc"
    else:
        steps = [round(rnd.uniform(0.5, 2.0), rnd.choice((1, 3, 9))) for _ in range(3)]
        res.step_times_s, res.median_s = steps, sorted(steps)[1]
        res.p10_s, res.p90_s = min(steps), max(steps)
        # memory measured on some trials only: a column whose other rows are empty
        res.peak_mem_bytes = rnd.choice((None, 2**30 + rnd.randrange(10**6)))
    if extra:
        return trial_row(key, spec, res, predicted_step_s=rnd.uniform(1, 3))
    return trial_row(key, spec, res)


def sweep(root, key, count, seed, kill_at=None):
    """A sweep's write path on one key: ask, submitted, row file, tell; ``kill_at``: the
    process kills itself (SIGKILL) after that many trials' row files, before telling."""
    rnd = random.Random(seed)
    store = ResultStore(root)
    study = LayoutStudy(store.ledger(), key.name, [1, 2, 4])
    for i in range(count):
        a2a = rnd.choice((1, 2, 4))
        number, trial_id, a2a = study.ask(a2a, key.slug)
        study.submitted(number, str(100 + number), "local", "/jobs")
        row = row_for(key, a2a, number, rnd, extra=rnd.random() < 0.05)
        row["trial_id"] = trial_id
        store.add(row, key)
        if kill_at == i:
            os.kill(os.getpid(), signal.SIGKILL)
        study.tell(number, Status(row["status"]), None, row=row)


def _run(target, *args):
    proc = mp.get_context("spawn").Process(target=target, args=args)
    proc.start()
    return proc


def tables(root):
    return {name: (root / name).read_bytes() for name in ("trials.csv", "recommendations.csv")}


def rebuilt_from_scratch(root, tmp):
    """The tables a full rebuild writes, in a copy of the folder (its index dropped)."""
    copy = tmp / "copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(root, copy)
    (copy / ".tables.json").unlink(missing_ok=True)
    ResultStore(copy).rebuild_all()
    return tables(copy), {p.relative_to(copy): p.read_bytes()
                          for p in sorted((copy / "rows").rglob("*.json"))}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_incremental_tables_equal_a_full_rebuild_after_random_sweeps(tmp_path, seed):
    rnd = random.Random(seed)
    root = tmp_path / "res"
    for step in range(7):
        what = rnd.choice(("sweep", "sweep", "concurrent", "kill")) if step else "sweep"
        picked = rnd.sample(KEYS, 2)
        if what == "sweep":
            sweep(root, picked[0], rnd.randint(1, 6), rnd.random())
        elif what == "concurrent":  # two sweeps at once: two keys, or both on one key
            keys = [picked[0], picked[rnd.random() < 0.5]]
            procs = [_run(sweep, root, k, rnd.randint(2, 6), rnd.random()) for k in keys]
            for p in procs:
                p.join(120)
                assert p.exitcode == 0
        else:  # killed between a row file and its tell: the next update imports the row
            p = _run(sweep, root, picked[0], 5, rnd.random(), rnd.randint(0, 4))
            p.join(120)
            assert p.exitcode == -signal.SIGKILL
            sweep(root, picked[1], 2, rnd.random())  # another sweep's update comes next
        ResultStore(root).rebuild()
        want, want_rows = rebuilt_from_scratch(root, tmp_path)
        assert tables(root) == want, f"step {step}: {what}"
        assert {p.relative_to(root): p.read_bytes()
                for p in sorted((root / "rows").rglob("*.json"))} == want_rows
    assert len((root / "trials.csv").read_text().splitlines()) > 10


def _age(root):
    """Time passes: every journal and row folder was last written long ago, at one fixed
    time (a time within two seconds of an update is not trusted to show every write)."""
    old = 1_000_000_000
    for path in [*(root / "journals").glob("*.journal"), *(root / "rows").glob("*/")]:
        os.utime(path, (old, old))


def test_the_update_replays_only_the_keys_that_changed(tmp_path, monkeypatch):
    root = tmp_path / "res"
    for i, key in enumerate(KEYS[:6]):
        sweep(root, key, 3, i)
    _age(root)
    ResultStore(root).rebuild()
    before = tables(root)
    sweep(root, KEYS[2], 2, 99)
    recent = ResultStore(root)
    recent.rebuild()  # KEYS[2] just written: derived now and again by the next update
    _age(root)
    opened = []
    real_get = journals.Journals.get
    monkeypatch.setattr(journals.Journals, "get",
                        lambda self, name: (opened.append(name), real_get(self, name))[1])
    ResultStore(root).rebuild()
    assert set(opened) == {KEYS[2].name}
    after = tables(root)
    assert after != before
    assert after == rebuilt_from_scratch(root, tmp_path)[0]
    opened.clear()
    _age(root)
    ResultStore(root).rebuild()  # nothing changed since: nothing replayed
    assert opened == [] and tables(root) == after


def test_a_rows_text_depends_on_that_row_alone():
    assert csv_line([1, 2.0, None, float("nan"), True, "a,b", 1073741824, 0.1 + 0.2]) == \
        '1,2.0,,,True,"a,b",1073741824,0.30000000000000004\n'


def _older(row):
    """A row as an hcp-tune before dp, mbs and micro_batches joined the key stored it."""
    return {k: v for k, v in row.items() if k not in ("dp", "mbs", "micro_batches")}


def test_an_older_single_journal_is_split_once_with_a_line_saying_so(tmp_path, capsys):
    root = tmp_path / "res"
    storage = open_storage(str(root / "optuna.journal"))
    store = ResultStore(root)
    rnd = random.Random(5)
    for key in KEYS[:3]:
        study = LayoutStudy(storage, key.name, [1, 2, 4])
        for a2a in (1, 2):
            number, trial_id, _ = study.ask(a2a, key.slug)
            study.submitted(number, "7", "local", "/jobs")
            row = _older({**row_for(key, a2a, number, rnd), "trial_id": trial_id})
            store.add(row, key)
            study.tell(number, Status(row["status"]), None, row=row)
    waiting = LayoutStudy(storage, KEYS[0].name, [1, 2, 4])  # submitted, never told
    number, trial_id, _ = waiting.ask(4, KEYS[0].slug)
    waiting.submitted(number, "8", "slurm", "/jobs")
    held = Ledger(storage).rows()

    store.rebuild()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "one journal per sweep key" in err[0] and "3 studies" in err[0]
    assert not (root / "optuna.journal").exists() and (root / "optuna.journal.migrated").exists()
    assert sorted(p.stem for p in (root / "journals").glob("*.journal")) == \
        sorted(k.slug for k in KEYS[:3])
    assert Ledger(store.ledger()).rows() == held  # every row, as it was
    again = LayoutStudy(store.ledger(), KEYS[0].name, [1, 2, 4])
    (o,) = again.outstanding(set())
    assert (o.number, o.trial_id, o.job_id, o.executor) == (number, trial_id, "8", "slurm")
    rows = store.rows()
    assert len(rows) == 6 and {(r["dp"], r["mbs"], r["micro_batches"]) for r in rows} == {(1, 1, 1)}
    store.rebuild()
    assert capsys.readouterr().err == ""  # once
    assert tables(root) == rebuilt_from_scratch(root, tmp_path)[0]


def test_an_rdb_storage_stays_one_storage(tmp_path):
    url = f"sqlite:///{tmp_path}/optuna.db"
    root = tmp_path / "res"
    sweep_rdb = LayoutStudy(open_storage(url), KEYS[0].name, [1, 2])
    number, trial_id, _ = sweep_rdb.ask(1, KEYS[0].slug)
    row = {**row_for(KEYS[0], 1, number, random.Random(1)), "trial_id": trial_id}
    ResultStore(root).add(row, KEYS[0])
    sweep_rdb.tell(number, Status(row["status"]), None, row=row)
    ResultStore(root, url).rebuild()
    assert not (root / "journals").exists()
    assert json.loads(Ledger(url).rows()[(KEYS[0].name, trial_id)]) == row


class _Quiet:
    def trial(self, *args, **kwargs):
        pass


def test_resume_planning_replays_only_the_planned_keys(tmp_path, monkeypatch):
    from hcp_tune import config
    from hcp_tune.engine.sweep import Sweeper

    root = tmp_path / "res"
    for i, key in enumerate(KEYS):
        sweep(root, key, 2, i)
    opened = []
    real_get = journals.Journals.get
    monkeypatch.setattr(journals.Journals, "get",
                        lambda self, name: (opened.append(name), real_get(self, name))[1])
    cfg = config.load(["cluster=local", "model=tiny", "cp=4", "tp=1", "seq=[2048,4096]",
                       "runner=attention", "env_tag=night-2", "executor=local",
                       f"results_dir={root}"])
    plan = Sweeper(cfg, _Quiet()).plan()
    planned = {k.name for k in plan.keys}
    assert planned == {k.name for k in KEYS if k.env_tag == "night-2" and k.tp == 1}
    assert set(opened) == planned  # the other ten keys' journals were never replayed
    assert plan.resumed == 4  # the planned keys' stored trials were found
