"""Where the studies live: one optuna journal file per sweep key under
``results/journals/`` (``Journals``: safe on a cluster's shared file system, and replayed
only when its key is used), or every study in one storage (an RDB URL, opened by ``rdb``,
or one journal file: ``open_storage``)."""
from __future__ import annotations

import contextlib
import json
import signal
import threading
from pathlib import Path
from typing import Any, Iterator, Optional

import optuna

from hcp_tune.store.records import name_slug


class Journals:
    """The ledger of a results folder: one optuna journal file per study (per sweep key),
    ``<folder>/<slug>.journal`` (the slug of the study's name, as the key's row folder),
    each opened only when its study is asked for. Opening a journal replays it, so a
    command pays for the keys it touches, not for every trial the folder ever stored."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._open: dict[str, Any] = {}

    def path(self, name: str) -> Path:
        return self.folder / f"{name_slug(name)}.journal"

    def get(self, name: str) -> Any:
        """The storage holding study ``name`` (opened once, replayed on first use)."""
        storage = self._open.get(name)
        if storage is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            storage = journal_storage(self.path(name))
            self._open[name] = storage
        return storage

    def forget(self, name: str) -> None:
        """Let go of study ``name``'s replayed journal (its memory); opened again on use."""
        self._open.pop(name, None)

    def slugs(self) -> list[str]:
        return sorted(p.stem for p in self.folder.glob("*.journal"))

    def name_at(self, slug: str) -> Optional[str]:
        """The name of the study in ``<slug>.journal``, read from its first operation
        (which creates the study) without replaying the journal; None without one."""
        try:
            with open(self.folder / f"{slug}.journal", "rb") as handle:
                first = json.loads(handle.readline() or b"{}")
        except (OSError, json.JSONDecodeError):
            return None  # none, or damaged: not a study this ledger wrote
        if isinstance(first, dict) and first.get("op_code") == 0 \
                and isinstance(first.get("study_name"), str):
            return first["study_name"]
        return None

    def names(self) -> list[str]:
        """Every study's name (one line read per journal; none replayed)."""
        found = (self.name_at(p.stem) for p in self.folder.glob("*.journal"))
        return sorted(n for n in found if n is not None)


def storage_for(storage: Any, name: str) -> Any:
    """The optuna storage that holds study ``name``: its journal in a ``Journals``, else
    ``storage`` itself (an RDB URL's storage, or one journal file, holds every study)."""
    return storage.get(name) if isinstance(storage, Journals) else storage


def copy_study(from_storage: Any, name: str, to_storage: Any) -> None:
    """Study ``name`` with every trial (running ones too, numbers kept) into another
    storage: how an older folder's single journal is split into per-key journals."""
    optuna.copy_study(from_study_name=name, from_storage=from_storage, to_storage=to_storage)


def open_storage(url_or_path: Any) -> Any:
    """An RDB URL (``sqlite:///x.db``, ``postgresql://...``) or a journal file path; a
    storage object (or ``Journals``) is returned as it is."""
    if not isinstance(url_or_path, (str, Path)):
        return url_or_path
    url_or_path = str(url_or_path)
    if "://" in url_or_path:  # a database: opened by ``rdb`` (driver, retries, one-line errors)
        from hcp_tune.store import rdb

        return optuna.storages.get_storage(rdb.open_storage(url_or_path))
    Path(url_or_path).parent.mkdir(parents=True, exist_ok=True)
    return journal_storage(url_or_path)


def journal_storage(path: str | Path) -> Any:
    """An optuna storage on the journal file ``path`` whose appends Ctrl-C cannot cut: a
    SIGINT that lands inside one (optuna takes a lock file, writes, renames it back) waits
    until the append is whole. Cut there, optuna's lock release raised FileNotFoundError
    over the KeyboardInterrupt, and the sweep died with a traceback instead of cancelling
    its jobs and exiting 130 (CI, 2026-12-07)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    class UncutBackend(JournalFileBackend):
        def append_logs(self, logs: list) -> None:
            with sigint_deferred():
                super().append_logs(logs)

    return JournalStorage(UncutBackend(str(path)))


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold a SIGINT that arrives in the block until it ends, then deliver it to the
    handler that was there (the main thread only: signals reach no other)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    before = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        if held and callable(before):
            before(signal.SIGINT, None)
        elif held and before == signal.SIG_DFL:
            raise KeyboardInterrupt
