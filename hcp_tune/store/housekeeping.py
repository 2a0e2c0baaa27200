"""Housekeeping of a results folder: which sweeps run on it, dropping or archiving an env
tag's trials (``results drop|archive env_tag=X``), and moving its journals' studies into a
team's database (``results migrate search.storage=postgresql://...``).

A sweep marks the folder while it runs (``sweeps/<host>-<pid>-<n>.running``, written under
the folder's lock by ``mark_sweep``); ``take_tag`` holds the same lock and refuses while a
marker's sweep may be running, so it never removes a key a sweep is writing.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Optional

from hcp_tune.store.folderlock import pid_alive
from hcp_tune.store.folder import JOURNALS, LEDGER_FILE, LEGACY_JOURNAL, ResultStore
from hcp_tune.store.records import ROW_FILES
from hcp_tune.redact import redact_all
from hcp_tune.spec import atomic_write_text
from hcp_tune.errors import HcpError

SWEEPS = "sweeps"  # sweeps/<host>-<pid>-<n>.running: a sweep is running on the folder
ARCHIVE = "archive"  # archive/<env_tag>/: a tag's keys that ``results archive`` moved


class HousekeepingError(HcpError):
    """``results drop`` / ``results archive`` cannot do what was asked (bad input, a
    sweep running): one line for the user."""


def mark_sweep(store: ResultStore) -> Path:
    """Say a sweep runs on this folder (``sweeps/<host>-<pid>-<n>.running``, written
    under the lock, so housekeeping that holds the lock either sees it or finishes
    first); the sweep removes it when it ends (``unmark_sweep``). The markers of this
    host's sweeps that died without removing theirs (SIGKILL, a node lost) go first. The
    marker keeps the command line without its credentials (``hcp_tune.redact``): the
    folder is shared, the marker readable by the team."""
    with store.lock():
        running_sweeps(store)  # (removes this host's dead markers)
        # whole or absent (atomic: a marker a kill left half-written would read as a
        # sweep running for ever), readable by teammates; the name is this sweep's own
        path = store.root / SWEEPS / (f"{socket.gethostname()}-{os.getpid()}-"
                                      f"{secrets.token_hex(4)}.running")
        atomic_write_text(str(path), json.dumps({
            "host": socket.gethostname(), "pid": os.getpid(),
            "started": _started(os.getpid()), "argv": redact_all(sys.argv)}))
    return path


def unmark_sweep(marker: Optional[Path]) -> None:
    if marker is not None:
        marker.unlink(missing_ok=True)


def _started(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat's 22nd
    field), so that a dead sweep's pid taken by a new process is not taken for the sweep;
    None where /proc is not there."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(mark: dict) -> bool:
    pid = int(mark["pid"])
    if not pid_alive(pid):
        return False
    started = mark.get("started")
    return started is None or _started(pid) in (None, started)


def running_sweeps(store: ResultStore) -> list[str]:
    """The sweeps that may be running on this folder: every marker but those of this
    host whose process is gone (a sweep killed with SIGKILL, or its pid now another
    process's; those are removed). A marker from another host cannot be checked from
    here: it counts as running."""
    out = []
    for path in sorted((store.root / SWEEPS).glob("[!.]*.running")):  # not a write's .tmp-*
        try:
            mark = json.loads(path.read_text())
            host, pid = str(mark["host"]), int(mark["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            out.append(f"{path} (unreadable)")
            continue
        if host == socket.gethostname() and not _alive(mark):
            path.unlink(missing_ok=True)
            continue
        out.append(f"{path} (pid {pid} on {host})")
    return out


def take_tag(store: ResultStore, env_tag: str, archive: bool) -> tuple[int, int, Optional[Path]]:
    """Remove an env tag's keys from the folder: their row folders and journals, then
    their lines of the tables. ``archive``: moved to ``archive/<env_tag>/`` (itself a
    results folder: ``report results_dir=<it>`` reads it), else deleted. Under the
    lock; refused (``HousekeepingError``) while a sweep runs on the folder or when the
    folder holds no such tag. The keys are first moved aside in one folder and the
    tables rewritten without them; a command killed part way leaves that folder
    (``.taking-*``) for a person to look at, never a half-dropped key.
    Returns (keys, row files, where archived)."""
    from hcp_tune.store import journals, studies

    storage = store.ledger()
    if not isinstance(storage, journals.Journals):  # (ledger() without a storage: never)
        raise HousekeepingError("this folder's ledger is not journals/")
    target = store.root / ARCHIVE / env_tag if archive else None
    with store.lock():
        busy = running_sweeps(store)
        if busy:
            raise HousekeepingError(
                f"{store.root}: a sweep is running on this folder ({busy[0]}"
                f"{f' and {len(busy) - 1} more' if len(busy) > 1 else ''}): wait for it to "
                "end (a marker left by a sweep that died on another host: delete it)")
        keys = store.folder_keys()
        slugs = {s for s, k in keys.items() if str(k.env_tag) == env_tag}
        slugs |= {s for s in storage.slugs()
                  if _tag_of(storage.name_at(s)) == env_tag}
        if not slugs:
            tags = sorted({str(k.env_tag) for k in keys.values()})
            raise HousekeepingError(
                f"env_tag={env_tag}: no such tag in {store.root}; it holds "
                f"{', '.join(tags) if tags else 'no trials'}")
        if target is not None and target.exists():
            raise HousekeepingError(f"{target} exists: that tag was archived before; "
                                    "move that folder away first")
        aside = Path(tempfile.mkdtemp(dir=store.root, prefix=".taking-"))
        (aside / "rows").mkdir()
        (aside / JOURNALS).mkdir()
        files = 0
        for slug in sorted(slugs):
            rows = store.root / "rows" / slug
            if rows.is_dir():
                files += sum(1 for _ in rows.glob(ROW_FILES))
                os.rename(rows, aside / "rows" / slug)
            journal = storage.folder / f"{slug}.journal"
            if journal.exists():
                os.rename(journal, aside / JOURNALS / journal.name)
        store.rebuild_locked(studies.Ledger(journals.Journals(storage.folder)), False)
        if target is not None:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.rename(aside, target)
        else:
            shutil.rmtree(aside)
    return len(slugs), files, target


def migrate(store: ResultStore, url: str) -> tuple[int, int, int]:
    """Move the studies of this folder's journals (``journals/``, or an older folder's
    single journal, split first) into the database at ``url``: a study the database lacks
    is copied whole (every trial, numbers kept); one it has gets the rows it lacks (by
    trial id). Then the count check: every (study, trial id) holding a row in the journals
    must hold it in the database, else ``HousekeepingError``. Running it again adds
    nothing. The folder then syncs from the database (``.ledger.json``); its journals stay
    as they were. Under the lock, refused while a sweep runs. Returns (studies, trials
    copied, rows already there)."""
    from hcp_tune.store import journals, studies

    target = journals.open_storage(url)  # a database that refuses us: one line, nothing done
    with store.lock():
        busy = running_sweeps(store)
        if busy:
            raise HousekeepingError(f"{store.root}: a sweep is running on this folder "
                                    f"({busy[0]}): migrate when it has ended")
        if (store.root / LEGACY_JOURNAL).is_file() and not (store.root / JOURNALS).is_dir():
            store._migrate()  # noqa: SLF001 - the split, under the lock this holds
        source = studies.Ledger(journals.Journals(store.root / JOURNALS))
        names = source.names()
        if not names:
            raise HousekeepingError(f"{store.root}: no journals to migrate ({JOURNALS}/ holds "
                                    "no study); a sweep with search.storage=URL writes there")
        dest = studies.Ledger(target)
        there, copied, already = set(dest.names()), 0, 0
        for name in names:
            rows = source.rows([name])
            if name not in there:
                journals.copy_study(source.storage.get(name), name, target)
                copied += len(source.study(name).get_trials(deepcopy=False))
            else:
                have = dest.rows([name])
                already += sum(1 for k in rows if k in have)
                copied += dest.import_rows(name, [json.loads(t) for k, t in rows.items()
                                                  if k not in have])
            missing = set(rows) - set(dest.rows([name]))
            if missing:
                raise HousekeepingError(
                    f"count check failed: study {name!r} has {len(rows)} rows in the journals "
                    f"but {len(rows) - len(missing)} in the database; nothing else was "
                    "changed in the folder: run results migrate again")
            source.storage.forget(name)
        store.rebuild_locked(dest, True)
        from hcp_tune.store import rdb

        atomic_write_text(str(store.root / LEDGER_FILE),
                          json.dumps({"storage": rdb.shown_url(target)}))
    return len(names), copied, already


def _tag_of(study_name: Optional[str]) -> Optional[str]:
    """The env tag in a study's name (``SweepKey.name``: ``field=value|...``)."""
    if not study_name:
        return None
    fields = dict(part.partition("=")[::2] for part in study_name.split("|"))
    return fields.get("env_tag")
