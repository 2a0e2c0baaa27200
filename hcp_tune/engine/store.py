"""Measurements and recommendations under ``results/``: rows, the ledger, the tables.

Layout of a results folder:

- ``journals/<sweep-key-hash>.journal`` (or ``search.storage``, one storage for every key):
  the record, one optuna study per sweep key in its own journal file, so that a command
  replays only the keys it touches; each finished trial holds its whole row (``tuner``).
  A folder written with one ``optuna.journal`` is split once (``ResultStore.ledger``).
- ``rows/<sweep-key-hash>/<trial-id>.json``: one file per finished trial, written
  atomically the moment its result is known (before it is told to the study, so a killed
  orchestrator loses nothing) and rewritten from the studies by ``rebuild``: a view,
  read through ``ResultStore.rows()``, or only the folders a command needs (``key_rows``:
  one key's; ``tag_rows``: the keys of some env tags, found from one row per folder), so
  that what ``recommend``, ``report env_tag=X``, ``regress`` and resume planning cost does
  not grow with every night the folder holds. Files the studies lack (an older
  hcp-tune's folder) are imported into them once.
- ``trials.csv`` and ``recommendations.csv``: tables rebuilt from the studies under an
  exclusive lock (``.lock``) and replaced atomically, so a reader sees the old table or
  the new one, and concurrent sweeps serialise their rebuilds instead of interleaving.
  Each row's text depends on that row alone (``csv_line``), so ``rebuild`` re-derives only
  the keys whose journal or row folder changed since the tables were written
  (``.tables.json``: a cache of each key's place in the tables and what it was derived
  from; without it, or when it does not match the tables, every key is derived).
- ``sweeps/<host>-<pid>-*.running``: a sweep is running on the folder (``mark_sweep``);
  ``results drop|archive env_tag=X`` (``take_tag``) refuses while one is, and moves an
  archived tag to ``archive/<env_tag>/``, a results folder of its own.
"""
from __future__ import annotations

import csv
import fcntl
import io
import json
import math
import os
import shutil
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from hcp_tune.costmodel.microbatch import tokens_per_gpu_s
from hcp_tune.engine.records import (
    KEY_FIELDS,
    OLDER_ROW_DEFAULTS,
    RECOMMENDATION_COLUMNS,
    ROW_SCHEMA,
    TRIAL_COLUMNS,
    Recommendation,
    ResultsTooNew,
    TrialRow,
    Verification,
    key_field,
    name_slug,
    row_text,
)
from hcp_tune.errors import HcpError
from hcp_tune.noise import row_noise
from hcp_tune.spec import TrialResult, TrialSpec, atomic_write_text

# The columns of trials.csv (``records.TrialRow``'s fields, in order; a row's extra
# fields, such as a skipped layout's ``predicted_step_s``, follow) and of
# recommendations.csv (``records.Recommendation``'s). Both files always have their header,
# even when nothing was stored or ranked.
__all__ = ["KEY_FIELDS", "TRIAL_COLUMNS", "RECOMMENDATION_COLUMNS", "ROW_SCHEMA",
           "ResultsTooNew", "ResultStore", "SweepKey", "trial_row", "recommendations"]


@dataclass(frozen=True)
class SweepKey:
    """What a recommendation is for: one measured configuration of one software stack."""

    cluster: str
    model: str
    tp: int
    cp: int
    seq: int
    runner: str
    env_tag: str
    pp: int = 1
    dp: int = 1
    mbs: int = 1
    micro_batches: int = 1

    @property
    def name(self) -> str:
        # a field at its OLDER_ROW_DEFAULTS value is left out so that keys (and their slugs,
        # row folders and optuna studies) stored before it joined the key stay the same
        return "|".join(f"{k}={getattr(self, k)}" for k in KEY_FIELDS
                        if getattr(self, k) != OLDER_ROW_DEFAULTS.get(k))

    @property
    def slug(self) -> str:
        return name_slug(self.name)

    @classmethod
    def of(cls, row: dict[str, Any]) -> "SweepKey":
        """The key a row (or recommendation) belongs to, from its key fields."""
        return cls(**{k: key_field(row, k) for k in KEY_FIELDS})

    def holds(self, row: dict[str, Any]) -> bool:
        """The row is one of this key's trials (selected by the key's fields, not an id)."""
        return all(key_field(row, k) == getattr(self, k) for k in KEY_FIELDS)


def key_rows(rows: list[dict[str, Any]], key: SweepKey) -> list[dict[str, Any]]:
    """The rows (or recommendations) of one sweep key, selected by its fields: the one
    selection every command uses (an older row's missing key fields read as their defaults)."""
    return [r for r in rows if key.holds(r)]


def single_run_fields(key: SweepKey, spec: TrialSpec, result: TrialResult) -> dict[str, Any]:
    """The micro-batch fields of a row measured by one run (``spec``): runner=bridge
    measured at ``spec.micro_batches`` (at the user's m, its median is the step there);
    the attention runner has none."""
    if spec.runner != "bridge":
        return {}
    m = max(1, spec.micro_batches)
    return {"measured_micro_batches": json.dumps([m]),
            "point_medians_s": json.dumps([result.median_s]),
            "step_at_user_m_s": result.median_s if m == key.micro_batches else None}


def trial_row(key: SweepKey, spec: TrialSpec, result: TrialResult, *,
              micro: Optional[dict[str, Any]] = None, **extra: Any) -> dict[str, Any]:
    """One flat row (``records.TrialRow.to_dict``): the key, the layout, the status and
    every measured statistic. ``micro``: the micro-batch fields of a trial measured at
    several m (``engine.trials.point_fields``); default those of one run of ``spec``."""
    return TrialRow(
        **{k: getattr(key, k) for k in KEY_FIELDS},
        trial_id=spec.trial_id,
        a2a=spec.a2a,
        p2p=spec.p2p,
        comm_type=spec.comm_type,
        status=result.status.value,
        failure_class=result.failure_class.value if result.failure_class else "",
        error=result.error or "",
        median_s=result.median_s,
        p10_s=result.p10_s,
        p90_s=result.p90_s,
        steps=len(result.step_times_s),
        step_times_s=json.dumps(result.step_times_s),
        peak_mem_bytes=result.peak_mem_bytes,
        tflops_per_gpu=result.tflops_per_gpu,
        wall_s=result.wall_s,
        mem_note=result.mem_note,
        backend=result.backend,
        te_backend=result.te_backend,
        qkv_format=result.qkv_format,
        notes="; ".join(result.notes),
        verified=verified(result.verification),
        fingerprint=json.dumps(result.fingerprint, sort_keys=True),
        job_id=result.job_id or "",
        log_path=result.log_path or "",
        phases_s=json.dumps(result.phases_s, sort_keys=True),
        **(single_run_fields(key, spec, result) if micro is None else micro),
        extra=extra,
    ).to_dict()


def verified(evidence: dict[str, Any]) -> bool:
    """The trial proved CP active (``records.Verification``)."""
    return Verification.from_dict(evidence).verified


class ResultStore:
    """Rows in, tables out; every write atomic. The optuna studies in ``storage`` (default
    ``<root>/optuna.journal``) are the record; the row files and tables are its views."""

    def __init__(self, root: str | Path, storage: Any = None) -> None:
        self.root = Path(root)
        self.storage = storage

    @contextmanager
    def _lock(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def row_path(self, key: SweepKey, trial_id: str) -> Path:
        return self.root / "rows" / key.slug / f"{trial_id}.json"

    def add(self, row: dict[str, Any] | TrialRow, key: SweepKey) -> None:
        """Write one trial's row file now (atomic, one file per trial): the view written
        through, so a killed orchestrator loses nothing it was told."""
        row = row.to_dict() if isinstance(row, TrialRow) else row
        atomic_write_text(str(self.row_path(key, row["trial_id"])), row_text(row))

    def _files(self, slug: Optional[str] = None) -> list[tuple[Path, str, TrialRow]]:
        """Every readable row file (``slug``: only that key's folder, ``rows/<slug>/``):
        (path, text, row). Raises ``ResultsTooNew``."""
        return list(self._each_file(slug))

    def _each_file(self, slug: Optional[str] = None) -> Iterator[tuple[Path, str, TrialRow]]:
        """``_files``, one at a time (a reader of every row keeps only what it needs)."""
        pattern = f"{slug}/*.json" if slug is not None else "*/*.json"
        for path in sorted((self.root / "rows").glob(pattern)):
            try:
                text = path.read_text()
                raw = json.loads(text)
                if not isinstance(raw, dict):
                    continue
                row = TrialRow.from_dict(raw, where=str(path))
            except (OSError, json.JSONDecodeError, TypeError):
                continue  # a foreign or damaged file must not hide the rest
            yield path, text, row

    def rows(self) -> list[dict[str, Any]]:
        """Every stored row (dicts with the trials.csv columns; an older row's missing
        fields take their defaults). Raises ``ResultsTooNew`` for a row written by a newer
        hcp-tune, whose fields this one cannot vouch for."""
        return [row.to_dict() for _, _, row in self._each_file()]

    def key_rows(self, key: SweepKey) -> list[dict[str, Any]]:
        """The rows of one sweep key, selected by its fields. Reads only the key's folder
        (``rows/<slug>/``: every writer files a row under its key's slug, and a rebuild
        moves a row the studies hold there), so its cost is the key's rows, not the
        folder's."""
        return key_rows([row.to_dict() for _, _, row in self._files(key.slug)], key)

    def slug_rows(self, slug: str) -> list[dict[str, Any]]:
        """Every row in the key folder ``rows/<slug>/`` (dicts, as ``rows()`` gives)."""
        return [row.to_dict() for _, _, row in self._each_file(slug)]

    def folder_keys(self) -> dict[str, SweepKey]:
        """Each row folder (by slug) and the key its rows belong to, read from one readable
        row of it (every row in ``rows/<slug>/`` is that key's): what a folder holds,
        without reading every row."""
        out: dict[str, SweepKey] = {}
        for folder in sorted((self.root / "rows").glob("*/")):
            for path in sorted(folder.glob("*.json")):
                try:
                    raw = json.loads(path.read_text())
                    out[folder.name] = SweepKey.of(raw)
                    break
                except (OSError, json.JSONDecodeError, TypeError, AttributeError):
                    continue  # a foreign or damaged file: ask the next one
        return out

    def tag_rows(self, env_tags: set[str]) -> list[dict[str, Any]]:
        """The rows of the keys measured under ``env_tags``, in ``rows()``'s order: reads
        those keys' folders only (``report env_tag=X`` and ``regress`` cost the tags they
        name, not every night the folder holds)."""
        out = []
        for slug, key in self.folder_keys().items():
            if str(key.env_tag) in env_tags:
                out += [row.to_dict() for _, _, row in self._files(slug)
                        if str(row.env_tag) in env_tags]
        return out

    # ---------------------------------------------------------------- the ledger
    def ledger(self, storage: Any = None) -> Any:
        """The optuna storage of this folder's studies: ``storage`` when given (an RDB URL
        or one journal file: ``search.storage``), else one journal per key under
        ``journals/`` (``tuner.Journals``). A folder holding the single ``optuna.journal``
        of an older hcp-tune is split into per-key journals first, once, under the lock."""
        from hcp_tune.engine import tuner

        if storage is not None:
            return tuner.open_storage(storage)
        if (self.root / LEGACY_JOURNAL).is_file() and not (self.root / JOURNALS).is_dir():
            with self._lock():
                self._migrate()
        return tuner.Journals(self.root / JOURNALS)

    def _migrate(self) -> None:
        """(Under the lock.) Copy every study of ``optuna.journal`` into its own journal in
        a temporary folder, rename that folder to ``journals/`` (atomic: a reader sees no
        partitions or all of them) and keep the old file as ``optuna.journal.migrated``."""
        from hcp_tune.engine import tuner

        legacy, target = self.root / LEGACY_JOURNAL, self.root / JOURNALS
        if not legacy.is_file() or target.is_dir():
            return  # another process migrated it while this one waited for the lock
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=".journals-migrating-"))
        try:
            old = tuner.Ledger(legacy)
            names = old.names()
            parts = tuner.Journals(tmp)
            for name in names:
                tuner.copy_study(old.storage, name, parts.get(name))
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        os.replace(legacy, self.root / (LEGACY_JOURNAL + ".migrated"))
        print(f"{self.root}: the ledger moved from {LEGACY_JOURNAL} to one journal per sweep "
              f"key under {JOURNALS}/ ({len(names)} studies; once; the old file is kept as "
              f"{LEGACY_JOURNAL}.migrated)", file=sys.stderr)

    # ---------------------------------------------------------------- the tables
    def rebuild(self, storage: Any = None) -> tuple[Path, Path]:
        """Under the lock: import row files the studies lack (a folder written by an older
        hcp-tune, or a row written just before its orchestrator died), then rewrite the
        row files, trials.csv and recommendations.csv from the studies.

        With per-key journals (the default ledger), only the keys whose journal or row
        folder changed since the tables were last written are derived again; the other
        keys' lines are copied from the tables as they are (``.tables.json`` says where
        each key's lines lie). The result is the same, byte for byte, as deriving every key
        (``rebuild_all``); an RDB or single-journal storage derives every key."""
        return self._rebuild(storage, everything=False)

    def rebuild_all(self, storage: Any = None) -> tuple[Path, Path]:
        """``rebuild``, deriving every key from the studies (the index ignored)."""
        return self._rebuild(storage, everything=True)

    def _rebuild(self, storage: Any, everything: bool) -> tuple[Path, Path]:
        from hcp_tune.engine import tuner

        storage = self.ledger(storage or self.storage)
        with self._lock():
            self._rebuild_locked(tuner.Ledger(storage), everything)
        return self.root / "trials.csv", self.root / "recommendations.csv"

    def _rebuild_locked(self, ledger: Any, everything: bool) -> None:
        """``rebuild``'s work; the caller holds the lock."""
        from hcp_tune.engine import tuner

        partitioned = isinstance(ledger.storage, tuner.Journals)
        index = None if everything or not partitioned else self._read_index()
        slugs = self._slugs(ledger) if partitioned else None
        if index is None:
            dirty = set(slugs) if slugs is not None else None
            keep: dict[str, dict[str, Any]] = {}
        else:
            dirty = {s for s, st in slugs.items()
                     if index["slugs"].get(s, {}).get("stat") != st}
            keep = {s: e for s, e in index["slugs"].items() if s in slugs and s not in dirty}
        derived = self._derive(ledger, dirty)
        for s, e in derived.items():  # what it was derived from, read before: a trial
            e["stat"] = _settled((slugs or {}).get(s))  # appended meanwhile marks it changed
        entries = {**keep, **derived}
        extras = list(dict.fromkeys(x for s in sorted(entries) for x in entries[s]["extras"]))
        if index is not None and extras != index["extras"]:
            # a new (or gone) extra column changes every row's line: derive every key
            index, derived = None, self._derive(ledger, set(slugs))
            for s, e in derived.items():
                e["stat"] = _settled(slugs.get(s))
            entries = derived
            extras = list(dict.fromkeys(x for s in sorted(entries)
                                        for x in entries[s]["extras"]))
        self._write_tables(entries, index, extras, derived)

    def _slugs(self, ledger: Any) -> dict[str, list[int]]:
        """Each key folder (by slug) with a journal or a row folder, and what says it
        changed: its journal's size and time, its row folder's time."""
        out: dict[str, list[int]] = {}
        for path in ledger.storage.folder.glob("*.journal"):
            st = path.stat()
            out.setdefault(path.stem, [0, 0, 0])[:2] = [st.st_size, st.st_mtime_ns]
        rows = self.root / "rows"
        if rows.is_dir():
            for entry in os.scandir(rows):
                if entry.is_dir():
                    out.setdefault(entry.name, [0, 0, 0])[2] = entry.stat().st_mtime_ns
        return out

    def _derive(self, ledger: Any, slugs: Optional[set[str]]) -> dict[str, dict[str, Any]]:
        """For the key folders ``slugs`` (None: every key the storage or ``rows/`` holds),
        one key at a time: import the row files its study lacks, rewrite its row files
        from the study, and return per slug its tables' entry (``_entry``). A per-key
        journal is let go once its key is done, so memory holds one key's trials."""
        from hcp_tune.engine import tuner

        journals = ledger.storage if isinstance(ledger.storage, tuner.Journals) else None
        in_storage: dict[str, set[str]] = {}
        if journals is None:  # one storage: its study names, by slug
            for n in ledger.names():
                in_storage.setdefault(name_slug(n), set()).add(n)
        if slugs is None:
            folders = self.root / "rows"
            slugs = {*in_storage, *(journals.slugs() if journals else ()),
                     *(p.name for p in folders.iterdir() if p.is_dir())} \
                if folders.is_dir() else {*in_storage, *(journals.slugs() if journals else ())}
        out: dict[str, dict[str, Any]] = {s: _entry([], "") for s in slugs}
        for slug in sorted(slugs):
            on_disk: dict[Path, str] = {}
            by_name: dict[str, list[TrialRow]] = {}
            for path, text, row in self._files(slug):
                on_disk[path] = text
                by_name.setdefault(SweepKey.of(row.to_dict()).name, []).append(row)
            names = set(in_storage.get(slug, ()))
            if journals is not None and (found := journals.name_at(slug)) is not None:
                names.add(found)
            # a row file's own key decides its study (whatever folder it lies in)
            for name in sorted(names | set(by_name)):
                held = ledger.rows([name]) if name in names or ledger.has(name) else {}
                lost = [json.loads(row_text(r.to_dict())) for r in by_name.get(name, ())
                        if (name, r.trial_id) not in held]
                if lost:
                    ledger.import_rows(name, lost)
                    held = ledger.rows([name])
                views = []
                for (_, trial_id), text in held.items():
                    row = TrialRow.from_dict(json.loads(text), where=f"study {name}")
                    path = self.row_path(SweepKey.of(row.to_dict()), trial_id)
                    if on_disk.get(path) != text:
                        atomic_write_text(str(path), text)
                    views.append((path, row.to_dict()))
                rows = [r for _, r in sorted(views, key=lambda v: v[0])]
                if rows:
                    out[name_slug(name)] = _entry(rows, ledger.pareto(name, {name}))
                if journals is not None:
                    journals.forget(name)
        return out

    def _read_index(self) -> Optional[dict[str, Any]]:
        """``.tables.json`` when it describes the tables on disk (their sizes and times)."""
        try:
            index = json.loads((self.root / TABLES_INDEX).read_text())
            if index.get("version") != TABLES_INDEX_VERSION:
                return None
            for name in ("trials.csv", "recommendations.csv"):
                st = (self.root / name).stat()
                if [st.st_size, st.st_mtime_ns] != index["bytes"][name]:
                    return None  # written by something else since
            return index
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def _write_tables(self, entries: dict[str, dict[str, Any]], index: Optional[dict[str, Any]],
                      extras: list[str], derived: dict[str, dict[str, Any]]) -> None:
        """trials.csv: the header, then each key's rows in slug order (a kept key's lines
        copied from the old table); recommendations.csv: one line per key in key order;
        then the index. Each written atomically."""
        columns = [*TRIAL_COLUMNS, *extras]
        header = csv_line(columns)
        t_path, r_path = self.root / "trials.csv", self.root / "recommendations.csv"
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-", suffix="trials.csv")
        try:
            with os.fdopen(fd, "wb") as out, \
                    (open(t_path, "rb") if index is not None else io.BytesIO()) as old:
                pos = out.write(header.encode())
                for slug in sorted(entries):
                    e = entries[slug]
                    if slug in derived or index is None:
                        data = "".join(
                            base + "".join("," + _quoted(csv_cell(more.get(c))) for c in extras)
                            + "\n" for base, more in e.pop("rows")).encode()
                    else:
                        start, end = e["span"]
                        old.seek(start)
                        data = old.read(end - start)
                    e["span"] = [pos, pos + len(data)]
                    pos += out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, t_path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        recs = sorted((e["order"], e["rec"]) for e in entries.values() if e["rec"])
        atomic_write_text(str(r_path), csv_line(list(RECOMMENDATION_COLUMNS))
                          + "".join(line for _, line in recs))
        atomic_write_text(str(self.root / TABLES_INDEX), json.dumps({
            "version": TABLES_INDEX_VERSION, "extras": extras,
            "bytes": {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in (t_path, r_path)},
            "slugs": entries}, separators=(",", ":")))

    # ---------------------------------------------------------------- housekeeping
    def mark_sweep(self) -> Path:
        """Say a sweep runs on this folder (``sweeps/<host>-<pid>-<n>.running``, written
        under the lock, so housekeeping that holds the lock either sees it or finishes
        first); the sweep removes it when it ends (``unmark_sweep``)."""
        with self._lock():
            folder = self.root / SWEEPS
            folder.mkdir(parents=True, exist_ok=True)
            fd, path = tempfile.mkstemp(dir=folder, prefix=f"{socket.gethostname()}-"
                                        f"{os.getpid()}-", suffix=".running")
            with os.fdopen(fd, "w") as handle:
                json.dump({"host": socket.gethostname(), "pid": os.getpid(),
                           "argv": sys.argv}, handle)
        return Path(path)

    @staticmethod
    def unmark_sweep(marker: Optional[Path]) -> None:
        if marker is not None:
            marker.unlink(missing_ok=True)

    def running_sweeps(self) -> list[str]:
        """The sweeps that may be running on this folder: every marker but those of this
        host whose process is gone (a sweep killed with SIGKILL; those are removed). A
        marker from another host cannot be checked from here: it counts as running."""
        out = []
        for path in sorted((self.root / SWEEPS).glob("*.running")):
            try:
                mark = json.loads(path.read_text())
                host, pid = str(mark["host"]), int(mark["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                out.append(f"{path} (unreadable)")
                continue
            if host == socket.gethostname() and not _alive(pid):
                path.unlink(missing_ok=True)
                continue
            out.append(f"{path} (pid {pid} on {host})")
        return out

    def take_tag(self, env_tag: str, archive: bool) -> tuple[int, int, Optional[Path]]:
        """Remove an env tag's keys from the folder: their row folders and journals, then
        their lines of the tables. ``archive``: moved to ``archive/<env_tag>/`` (itself a
        results folder: ``report results_dir=<it>`` reads it), else deleted. Under the
        lock; refused (``HousekeepingError``) while a sweep runs on the folder or when the
        folder holds no such tag. The keys are first moved aside in one folder and the
        tables rewritten without them; a command killed part way leaves that folder
        (``.taking-*``) for a person to look at, never a half-dropped key.
        Returns (keys, row files, where archived)."""
        from hcp_tune.engine import tuner

        storage = self.ledger()
        if not isinstance(storage, tuner.Journals):  # (ledger() without a storage: never)
            raise HousekeepingError("this folder's ledger is not journals/")
        target = self.root / ARCHIVE / env_tag if archive else None
        with self._lock():
            busy = self.running_sweeps()
            if busy:
                raise HousekeepingError(
                    f"{self.root}: a sweep is running on this folder ({busy[0]}"
                    f"{f' and {len(busy) - 1} more' if len(busy) > 1 else ''}): wait for it to "
                    "end (a marker left by a sweep that died on another host: delete it)")
            keys = self.folder_keys()
            slugs = {s for s, k in keys.items() if str(k.env_tag) == env_tag}
            slugs |= {s for s in storage.slugs()
                      if _tag_of(storage.name_at(s)) == env_tag}
            if not slugs:
                tags = sorted({str(k.env_tag) for k in keys.values()})
                raise HousekeepingError(
                    f"env_tag={env_tag}: no such tag in {self.root}; it holds "
                    f"{', '.join(tags) if tags else 'no trials'}")
            if target is not None and target.exists():
                raise HousekeepingError(f"{target} exists: that tag was archived before; "
                                        "move that folder away first")
            aside = Path(tempfile.mkdtemp(dir=self.root, prefix=".taking-"))
            (aside / "rows").mkdir()
            (aside / JOURNALS).mkdir()
            files = 0
            for slug in sorted(slugs):
                rows = self.root / "rows" / slug
                if rows.is_dir():
                    files += sum(1 for _ in rows.glob("*.json"))
                    os.rename(rows, aside / "rows" / slug)
                journal = storage.folder / f"{slug}.journal"
                if journal.exists():
                    os.rename(journal, aside / JOURNALS / journal.name)
            self._rebuild_locked(tuner.Ledger(tuner.Journals(storage.folder)), False)
            if target is not None:
                target.parent.mkdir(parents=True, exist_ok=True)
                os.rename(aside, target)
            else:
                shutil.rmtree(aside)
        return len(slugs), files, target

    def recommendations(self) -> list[dict[str, Any]]:
        """recommendations.csv as dicts (``records.Recommendation``: a table of an older
        version reads with defaults, one of a newer version raises ``ResultsTooNew``)."""
        path = self.root / "recommendations.csv"
        try:
            with open(path, newline="") as handle:
                recs = [{k: _read_cell(k, v) for k, v in r.items()}
                        for r in csv.DictReader(handle)]
        except FileNotFoundError:
            return []
        return [Recommendation.from_dict(r, where=str(path)).to_dict() for r in recs]


_TEXT_CELLS = frozenset({"cluster", "model", "runner", "env_tag", "comm_type", "runner_up",
                         "missing", "pareto"})


def _read_cell(column: str, cell: Optional[str]) -> Any:
    """A table cell as the value it was written from (``csv_cell``): empty is None; text
    columns stay text; True/False, integers and floats (``1073741824.0``, as an older
    table's pandas wrote it, reads as a float) are parsed. The csv module, not pandas:
    ``recommend`` reads this one file, and importing pandas was most of its second."""
    if cell is None or cell == "":
        return None
    if column in _TEXT_CELLS:
        return cell
    if cell in ("True", "False"):
        return cell == "True"
    for kind in (int, float):
        try:
            return kind(cell)
        except ValueError:
            pass
    return cell


LEGACY_JOURNAL = "optuna.journal"  # the single journal of folders written before issue 20
JOURNALS = "journals"  # one journal per sweep key: journals/<slug>.journal
TABLES_INDEX = ".tables.json"  # where each key's lines lie in the tables (a cache)
TABLES_INDEX_VERSION = 1
SWEEPS = "sweeps"  # sweeps/<host>-<pid>-<n>.running: a sweep is running on the folder
ARCHIVE = "archive"  # archive/<env_tag>/: a tag's keys that ``results archive`` moved


class HousekeepingError(HcpError):
    """``results drop`` / ``results archive`` cannot do what was asked (bad input, a
    sweep running): one line for the user."""


RACY_NS = 2_000_000_000  # a time this recent may not yet show a write made in its tick


def _settled(stat: Optional[list[int]]) -> Optional[list[int]]:
    """A key's (journal size, journal time, row folder time) as the index keeps it, or
    None when a time is within ``RACY_NS`` of now: a file system stamps times in coarse
    ticks, so a row file written in the same tick as the snapshot would leave the folder's
    time unchanged; such a key is derived again by the next update, whatever it shows."""
    if stat is None or max(stat[1], stat[2]) > time.time_ns() - RACY_NS:
        return None
    return stat


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tag_of(study_name: Optional[str]) -> Optional[str]:
    """The env tag in a study's name (``SweepKey.name``: ``field=value|...``)."""
    if not study_name:
        return None
    fields = dict(part.partition("=")[::2] for part in study_name.split("|"))
    return fields.get("env_tag")


def csv_cell(v: Any) -> Any:
    """A table cell's text from the value alone: empty for None or NaN, ``repr`` for a
    float (``0.05``, ``2.0``), ``str`` for the rest. (pandas formatted a column's floats
    from the whole column, so one row's text depended on the others.)"""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return repr(v)
    return v if isinstance(v, str) else str(v)


def csv_line(values: list[Any]) -> str:
    """One CSV line (minimal quoting, ``\n``), each cell by ``csv_cell``."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow([csv_cell(v) for v in values])
    return buf.getvalue()


def _quoted(cell: str) -> str:
    """One cell as ``csv_line`` writes it among others (minimal quoting)."""
    if any(ch in cell for ch in ',"\n\r'):
        return '"' + cell.replace('"', '""') + '"'
    return cell


def _entry(rows: list[dict[str, Any]], pareto: str) -> dict[str, Any]:
    """A key's part of the tables: its rows as text (each row's trials.csv columns, and
    its extra fields, whose columns are known once every key is derived), its
    recommendation's line and sort order, and its rows' extra columns in order."""
    recs = recommendations(rows, {SweepKey.of(rows[0]).name: pareto}) if rows else []
    order = str(tuple(key_field(recs[0], k) for k in KEY_FIELDS)) if recs else ""
    return {"rows": [(csv_line([r.get(c) for c in TRIAL_COLUMNS])[:-1],
                      {k: v for k, v in r.items() if k not in TRIAL_COLUMNS}) for r in rows],
            "rec": csv_line([recs[0][c] for c in RECOMMENDATION_COLUMNS]) if recs else "",
            "order": order,
            "extras": list(dict.fromkeys(k for r in rows for k in r if k not in TRIAL_COLUMNS))}


def _nan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def rank(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per layout of one key, the best ok trial, fastest first (memory breaks ties)."""
    best: dict[tuple[int, int], dict[str, Any]] = {}
    for r in rows:
        if r["status"] != "ok" or not r.get("verified") or _nan(r.get("median_s")):
            continue  # only trials that proved CP was active are ranked
        k = (r["a2a"], r["p2p"])
        if k not in best or r["median_s"] < best[k]["median_s"]:
            best[k] = r
    return sorted(best.values(), key=lambda r: (r["median_s"], r.get("peak_mem_bytes") or 0))


def recommendations(rows: list[dict[str, Any]],
                    pareto: Optional[dict[str, str]] = None) -> list[dict[str, Any]]:
    """One recommendation per sweep key that has at least one ranked (ok) trial;
    ``pareto``: per key name, its study's Pareto front (``tuner.Ledger.pareto``)."""
    by_key: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        by_key.setdefault(tuple(key_field(r, k) for k in KEY_FIELDS), []).append(r)
    out = []
    for key, key_rows in sorted(by_key.items(), key=lambda kv: str(kv[0])):
        ranked = rank(key_rows)
        if not ranked:
            continue
        best = ranked[0]
        second: Optional[dict[str, Any]] = ranked[1] if len(ranked) > 1 else None
        margin = (second["median_s"] / best["median_s"] - 1) if second else None
        noise = max(row_noise(best), row_noise(second)) if second else 0.0
        base = {r["comm_type"]: r for r in ranked}
        cp = best["cp"]
        out.append(Recommendation(
            **dict(zip(KEY_FIELDS, key)),
            a2a=best["a2a"],
            p2p=best["p2p"],
            comm_type=best["comm_type"],
            median_s=best["median_s"],
            peak_mem_bytes=best.get("peak_mem_bytes"),
            runner_up=f"[{second['a2a']},{second['p2p']}]" if second else "",
            runner_up_median_s=second["median_s"] if second else None,
            margin=margin,
            tie=bool(second) and margin <= noise,
            speedup_vs_p2p=(base["p2p"]["median_s"] / best["median_s"]) if "p2p" in base and cp > 1 else None,
            speedup_vs_a2a=(base["a2a"]["median_s"] / best["median_s"]) if "a2a" in base and cp > 1 else None,
            trials=len(key_rows),
            ok_trials=sum(r["status"] == "ok" for r in key_rows),
            incomplete=bool(missing_layouts(key_rows)),
            missing="; ".join(missing_layouts(key_rows)),
            pareto=(pareto or {}).get(SweepKey.of(dict(zip(KEY_FIELDS, key))).name, ""),
            tokens_per_gpu_s=_tokens_per_gpu(dict(zip(KEY_FIELDS, key)), best["median_s"]),
        ).to_dict())
    return out


def _count(v: Any) -> int:
    return 0 if _nan(v) else int(v)


def _tokens_per_gpu(key: dict[str, Any], step_s: float) -> Optional[float]:
    """runner=bridge: tokens per second per GPU of a step of ``step_s`` at the key's m."""
    if key["runner"] != "bridge" or not step_s:
        return None
    dp = int(key["dp"])
    return tokens_per_gpu_s(step_s, m=int(key["micro_batches"]), mbs=int(key["mbs"]), dp=dp,
                            seq=int(key["seq"]),
                            world=int(key["tp"]) * int(key["cp"]) * dp * int(key["pp"]))


def _why_not(r: dict[str, Any]) -> str:
    cls = r.get("failure_class")
    return f"{r['status']} {cls}" if isinstance(cls, str) and cls else str(r["status"])


def missing_layouts(key_rows: list[dict[str, Any]]) -> list[str]:
    """Layouts of a key tried without a valid measurement ("[2,2] cancelled"): the key's
    ranking is incomplete until they are measured. A layout pruned after some measured
    steps counts as measured (it lost); one pruned before any, or cancelled, skipped,
    failed or invalid does not. (A runner=bridge trial pruned at one of its m keeps its
    steps but no median: its steps were not at the user's m.)"""
    measured = {(r["a2a"], r["p2p"]) for r in key_rows
                if (r["status"] == "ok" and r.get("verified"))
                or (r["status"] == "pruned" and (not _nan(r.get("median_s"))
                                                 or _count(r.get("steps")) > 0))}
    why: dict[tuple[int, int], str] = {}
    for r in key_rows:
        k = (r["a2a"], r["p2p"])
        if k not in measured:
            why[k] = _why_not(r)  # the latest row's reason (rows are in trial-id order)
    return [f"[{a},{p}] {w}" for (a, p), w in sorted(why.items())]
