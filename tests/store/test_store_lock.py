"""The results folder's lock where flock does not work (Lustre without flock: ENOSYS), with
writers posing as different hosts, and holders killed while they hold it."""
import errno
import fcntl
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

from hcp_tune.store import folderlock
from hcp_tune.store.folder import ResultStore, SweepKey

sys.path.insert(0, str(Path(__file__).parent))
from test_store import row  # noqa: E402

KEY = SweepKey("local", "tiny", 1, 4, 2048, "attention", "lock-test")


def _no_flock(*_args, **_kw):
    raise OSError(errno.ENOSYS, "Function not implemented")


def _host_writer(root: str, host: str, count: int) -> None:
    """A writer on another host whose mount has no flock: counts under the lock (a
    read-modify-write that two holders at once would lose an increment of), writes one
    row per trial of the shared key and rebuilds the tables after each."""
    fcntl.flock = _no_flock
    folderlock.HOST = host
    store = ResultStore(root)
    counter = Path(root) / "counter"
    for i in range(count):
        with store.lock():
            n = int(counter.read_text()) if counter.exists() else 0
            os.sched_yield()
            counter.write_text(str(n + 1))
        r = row(2 if i % 2 else 4, 1.0 + i / 100, key=KEY, n=i)
        r["trial_id"] = f"{host}-{r['trial_id']}"
        store.add(r, KEY)
        store.rebuild()


def test_writers_on_three_hosts_without_flock_lose_no_row(tmp_path):
    ctx = mp.get_context("spawn")
    hosts, count = ["node-a", "node-b", "node-c"], 6
    procs = [ctx.Process(target=_host_writer, args=(str(tmp_path), h, count)) for h in hosts]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
        assert p.exitcode == 0
    assert (tmp_path / "counter").read_text() == str(len(hosts) * count)
    assert (tmp_path / ".lock.filemode").exists()  # the fallback marked the folder
    assert not (tmp_path / ".lock.held").exists()  # released
    trials = pd.read_csv(tmp_path / "trials.csv")
    assert len(trials) == len(hosts) * count
    assert sorted({t.split("-")[0] + "-" + t.split("-")[1] for t in trials["trial_id"]}) == hosts
    from hcp_tune.store import studies

    held = studies.Ledger(ResultStore(tmp_path).ledger()).rows([KEY.name])
    assert len(held) == len(hosts) * count  # the shared key's journal holds every row


def test_flock_enosys_falls_back_to_a_lock_file_and_marks_the_folder(tmp_path, monkeypatch):
    lock = tmp_path / ".lock"
    monkeypatch.setattr(fcntl, "flock", _no_flock)
    with folderlock.hold(lock):
        holder = json.loads((tmp_path / ".lock.held").read_text())
        assert holder["host"] == folderlock.HOST and holder["pid"] == os.getpid()
    assert not (tmp_path / ".lock.held").exists()
    assert (tmp_path / ".lock.filemode").exists()
    monkeypatch.undo()  # this host's flock works, but another host fell back:
    with folderlock.hold(lock):  # the lock file is taken as well
        assert (tmp_path / ".lock.held").exists()


def test_a_flock_error_other_than_no_support_is_raised(tmp_path, monkeypatch):
    def bad(*_a):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(fcntl, "flock", bad)
    with pytest.raises(OSError, match="I/O error"):
        with folderlock.hold(tmp_path / ".lock"):
            pass


HOLDER = """
import sys, time
from hcp_tune.store import folderlock
folderlock.HOST = sys.argv[2]
with folderlock.LockFile(sys.argv[1], stale_s=1.0, heartbeat_s=0.2):
    print("held", flush=True)
    time.sleep(600)
"""


def _killed_holder(path: Path, host: str) -> None:
    """A process that takes the lock file as ``host`` and is killed (SIGKILL) holding it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), host],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert json.loads(path.read_text())["pid"] == proc.pid
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def _acquire_within(lock: folderlock.LockFile, timeout_s: float) -> bool:
    """Take ``lock`` in a thread; whether it was had within ``timeout_s`` (a guard
    against a hang, not a timing claim)."""
    got = threading.Event()

    def take():
        lock.acquire()
        got.set()

    threading.Thread(target=take, daemon=True).start()
    return got.wait(timeout_s)


@pytest.mark.parametrize("host", ["this", "node-b"])
def test_a_holder_killed_while_holding_does_not_block_the_next(tmp_path, host):
    path = tmp_path / ".lock.held"
    _killed_holder(path, folderlock.HOST if host == "this" else host)
    assert path.exists()  # the dead holder's file is left behind
    # this host: its pid is gone, taken over at once; another host: its file stops
    # being touched, taken over after stale_s (1 s here)
    lock = folderlock.LockFile(path, stale_s=1.0, heartbeat_s=0.2)
    assert _acquire_within(lock, 60)
    assert json.loads(path.read_text())["token"] == lock.token
    lock.release()
    assert not path.exists()
    assert not list(tmp_path.iterdir())  # no stale or temporary file left


def test_taking_over_puts_back_a_lock_that_changed_hands(tmp_path):
    """Two waiters judged the same file stale; the first took it over and now holds a new
    one: the second's take-over must not remove the live holder's file."""
    path = tmp_path / ".lock.held"
    path.write_text(json.dumps({"host": "node-b", "pid": 1, "token": "live"}))
    late = folderlock.LockFile(path)
    late._take_over({"host": "node-b", "pid": 1, "token": "the-stale-one"})
    assert json.loads(path.read_text())["token"] == "live"
    assert [p.name for p in tmp_path.iterdir()] == [".lock.held"]


def test_a_lock_file_checks_its_periods():
    with pytest.raises(ValueError, match=r"stale_s=1.0, heartbeat_s=2.0"):
        folderlock.LockFile("x", stale_s=1.0, heartbeat_s=2.0)
