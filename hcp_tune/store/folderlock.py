"""The exclusive lock of a results folder (``<root>/.lock``), on any file system a cluster
keeps results on.

``fcntl.flock`` first: the kernel (or the NFS server, which Linux asks through POSIX
locks) releases it when its holder dies, whatever killed it. Where ``flock`` does not
work (Lustre mounted without ``flock``: ENOSYS; some FUSE and NFS setups: EOPNOTSUPP or
ENOLCK; optuna#1300), or when ``HCP_TUNE_LOCK=file`` says so, the lock is a file,
``<root>/.lock.held``, created whole by one atomic ``link`` (as optuna's journal locks
create theirs), holding its holder's host, pid and a token:

- a holder touches it every ``HEARTBEAT_S`` while it holds it;
- a waiter takes a lock file over when its holder is gone: at once when the holder ran on
  this host and its pid is dead (a sweep killed with SIGKILL), else when the file's time
  has not moved for ``STALE_S`` of the waiter's own clock (a holder on another host that
  died: no clocks are compared across hosts);
- taking over renames the stale file aside and checks its token, so of two waiters that
  judged it stale only one wins, and a live holder's file is put back.

The first process that falls back leaves ``<root>/.lock.filemode``: from then on every
process on the folder also takes the lock file, even where its own ``flock`` works (hosts
that mount the folder differently still exclude each other).
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

HOST = socket.gethostname()  # who holds a lock file (a test may pose as another host)
HEARTBEAT_S = 5.0  # a holder touches its lock file this often
STALE_S = 60.0  # a lock file whose time has not moved this long: its holder is gone
NO_FLOCK = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL)
HELD_SUFFIX = ".held"  # <root>/.lock.held: the lock file
FILEMODE_SUFFIX = ".filemode"  # <root>/.lock.filemode: some host fell back to lock files


class LockError(OSError):
    """The folder's lock cannot be had (its folder cannot be written)."""


@contextmanager
def hold(path: str | Path) -> Iterator[None]:
    """Hold the exclusive lock ``path`` (e.g. ``results/.lock``) for the block."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    filemode = Path(f"{path}{FILEMODE_SUFFIX}")
    with open(path, "a") as handle:
        flocked = os.environ.get("HCP_TUNE_LOCK") != "file" and _flock(handle)
        try:
            if flocked and not filemode.exists():
                yield
                return
            if not flocked and not filemode.exists():
                filemode.touch()  # tell the hosts whose flock works to take the file too
            with LockFile(f"{path}{HELD_SUFFIX}"):
                yield
        finally:
            if flocked:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _flock(handle) -> bool:
    """Take ``flock`` on ``handle`` (blocking); False where the file system has none."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        return True
    except OSError as e:
        if e.errno in NO_FLOCK:
            return False
        raise


class LockFile:
    """An exclusive lock that is a file (see the module's docstring); a context manager."""

    def __init__(self, path: str | Path, stale_s: Optional[float] = None,
                 heartbeat_s: Optional[float] = None) -> None:
        self.path = Path(path)
        self.stale_s = STALE_S if stale_s is None else stale_s
        self.heartbeat_s = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
        if not self.stale_s > self.heartbeat_s > 0:
            raise ValueError(f"a lock file needs stale_s > heartbeat_s > 0, but got "
                             f"stale_s={self.stale_s}, heartbeat_s={self.heartbeat_s}")
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._beat: Optional[threading.Thread] = None

    def __enter__(self) -> "LockFile":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        body = json.dumps({"host": HOST, "pid": os.getpid(), "token": self.token}).encode()
        wait, seen, since = 0.005, None, time.monotonic()
        while True:
            if self._create(body):
                break
            holder = _read(self.path)
            stamp = _mtime(self.path)
            if stamp != seen:  # the holder is alive (or a new holder came): wait afresh
                seen, since = stamp, time.monotonic()
            if holder is not None and self._gone(holder, time.monotonic() - since):
                self._take_over(holder)
                continue
            time.sleep(wait)  # waiting for a holder: the poll a lock file allows
            wait = min(wait * 2, 0.5)
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True,
                                      name=f"lock heartbeat {self.path}")
        self._beat.start()

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None
        holder = _read(self.path)
        if holder is not None and holder.get("token") == self.token:
            aside = Path(f"{self.path}.{uuid.uuid4().hex}.released")
            try:
                os.rename(self.path, aside)
                os.unlink(aside)
            except FileNotFoundError:
                pass

    def _create(self, body: bytes) -> bool:
        """Create the lock file whole, atomically (write a private file, ``link`` it to
        the lock's name: link fails if the name exists); True when this process got it."""
        tmp = Path(f"{self.path}.{self.token}.new")
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            return False
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            return self._create_excl(body)  # a file system without hard links
        finally:
            tmp.unlink(missing_ok=True)

    def _create_excl(self, body: bytes) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        return True

    def _gone(self, holder: dict, unchanged_s: float) -> bool:
        """The holder is dead: its pid on this host is gone, or its file has not been
        touched for ``stale_s``."""
        if holder.get("host") == HOST and isinstance(holder.get("pid"), int):
            return not pid_alive(holder["pid"])
        return unchanged_s > self.stale_s

    def _take_over(self, stale: dict) -> None:
        """Remove the stale lock file, unless it changed hands meanwhile (then put the
        new holder's file back)."""
        aside = Path(f"{self.path}.{self.token}.stale")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # another waiter took it over first
        moved = _read(aside)
        if moved is not None and moved.get("token") != stale.get("token"):
            try:
                os.link(aside, self.path)  # a live holder's file: back where it was
            except FileExistsError:
                pass
        aside.unlink(missing_ok=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                os.utime(self.path)
            except OSError:
                pass  # taken over (this holder was judged dead): nothing to touch


def _read(path: Path) -> Optional[dict]:
    try:
        out = json.loads(path.read_text())
        return out if isinstance(out, dict) else {}
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # damaged or foreign: judged by its time alone


def _mtime(path: Path) -> Optional[int]:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    """Whether a process of this host runs under ``pid`` (one owned by another user too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
