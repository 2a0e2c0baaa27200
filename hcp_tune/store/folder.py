"""Measurements and recommendations under ``results/``: rows, the ledger, the tables.

Layout of a results folder:

- ``journals/<sweep-key-hash>.journal`` (or ``search.storage``, one storage for every key):
  the record, one optuna study per sweep key in its own journal file, so that a command
  replays only the keys it touches; each finished trial holds its whole row (``studies``).
  A folder written with one ``optuna.journal`` is split once (``ResultStore.ledger``).
  With a database (``search.storage=postgresql://...``: ``rdb``) the folder is a view of it
  (``.ledger.json``) that commands reading the tables sync first (``refresh``).
- ``rows/<sweep-key-hash>/<trial-id>.json``: one file per finished trial, written
  atomically when its result is known (before the study is told: a killed orchestrator
  loses nothing; its unrenamed ``.tmp-*`` is no row) and rewritten from the studies by
  ``rebuild``: a view, read through ``rows()``, or only the folders a command needs
  (``key_rows``: one key's; ``tag_rows``: some env tags' keys, found from one row per
  folder), so what ``recommend``, ``report``, ``regress`` and resume planning cost does not
  grow with every night the folder holds. Rows the studies lack are imported once.
- ``trials.csv`` and ``recommendations.csv``: tables rebuilt from the studies under an
  exclusive lock (``.lock``) and replaced atomically, so a reader sees the old table or
  the new one, and concurrent sweeps serialise their rebuilds instead of interleaving.
  Each row's text depends on that row alone (``csv_line``), so ``rebuild`` re-derives only
  the keys whose journal or row folder changed since the tables were written
  (``.tables.json``: a cache of each key's place in the tables and what it was derived
  from; without it, or when it does not match the tables, every key is derived).
- ``sweeps/<host>-<pid>-*.running``: a sweep is running on the folder; ``results
  drop|archive env_tag=X`` refuses while one is, and moves an archived tag to
  ``archive/<env_tag>/``, a results folder of its own (``housekeeping``).

The tables' text and ranking are ``tables``; the key and row schema ``records``.
"""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

from hcp_tune.store import folderlock
from hcp_tune.store.records import (
    KEY_FIELDS,
    RECOMMENDATION_COLUMNS,
    ROW_FILES,
    ROW_SCHEMA,
    TRIAL_COLUMNS,
    Recommendation,
    ResultsTooNew,
    SweepKey,
    TrialRow,
    key_rows,
    name_slug,
    row_text,
)
from hcp_tune.store.tables import (  # rank, recommendations, missing_layouts: re-exported
    csv_cell,
    csv_line,
    missing_layouts,
    quoted_cell,
    rank,
    read_cell,
    recommendations,
    table_entry,
)
from hcp_tune.store.trialrow import single_run_fields, trial_row, verified  # re-exported
from hcp_tune.spec import atomic_open, atomic_write_text

# The columns of trials.csv (``records.TrialRow``'s fields, then a row's extra fields) and
# of recommendations.csv (``records.Recommendation``'s); both always have their header.
__all__ = ["KEY_FIELDS", "TRIAL_COLUMNS", "RECOMMENDATION_COLUMNS", "ROW_SCHEMA",
           "ResultsTooNew", "ResultStore", "SweepKey", "key_rows", "trial_row", "rank",
           "recommendations", "missing_layouts", "csv_line", "csv_cell"]


class ResultStore:
    """Rows in, tables out; every write atomic. The optuna studies in ``storage`` (default
    ``<root>/optuna.journal``) are the record; the row files and tables are its views."""

    def __init__(self, root: str | Path, storage: Any = None) -> None:
        self.root = Path(root)
        self.storage = storage

    @contextmanager
    def lock(self) -> Iterator[None]:
        """The folder's exclusive lock (``folderlock``: flock, or a lock file where the
        file system has no flock)."""
        with folderlock.hold(self.root / ".lock"):
            yield

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
        pattern = f"{slug or '*'}/{ROW_FILES}"
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
            for path in sorted(folder.glob(ROW_FILES)):
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
        ``journals/`` (``journals.Journals``), or the database this folder was last synced
        from (``remembered``). A folder holding the single ``optuna.journal``
        of an older hcp-tune is split into per-key journals first, once, under the lock."""
        from hcp_tune.store import journals

        storage = storage if storage is not None else self.remembered()
        if storage is not None:
            return journals.open_storage(storage)
        if (self.root / LEGACY_JOURNAL).is_file() and not (self.root / JOURNALS).is_dir():
            with self.lock():
                self._migrate()
        return journals.Journals(self.root / JOURNALS)

    def _migrate(self) -> None:
        """(Under the lock.) Copy every study of ``optuna.journal`` into its own journal in
        a temporary folder, rename that folder to ``journals/`` (atomic: a reader sees no
        partitions or all of them) and keep the old file as ``optuna.journal.migrated``."""
        from hcp_tune.store import journals, studies

        legacy, target = self.root / LEGACY_JOURNAL, self.root / JOURNALS
        if not legacy.is_file() or target.is_dir():
            return  # another process migrated it while this one waited for the lock
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=".journals-migrating-"))
        try:
            old = studies.Ledger(legacy)
            names = old.names()
            parts = journals.Journals(tmp)
            for name in names:
                journals.copy_study(old.storage, name, parts.get(name))
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

        Only the keys whose study (journal, or trials in a database) or row folder changed
        since the tables were written are derived again; the other keys' lines are copied
        (``.tables.json`` says where they lie). The result is the same, byte for byte, as
        deriving every key (``rebuild_all``); a single journal file derives every key."""
        return self._rebuild(storage, everything=False)

    def rebuild_all(self, storage: Any = None) -> tuple[Path, Path]:
        """``rebuild``, deriving every key from the studies (the index ignored)."""
        return self._rebuild(storage, everything=True)

    def _rebuild(self, storage: Any, everything: bool) -> tuple[Path, Path]:
        from hcp_tune.store import rdb, studies

        storage = self.ledger(storage or self.storage)
        with self.lock():
            self.rebuild_locked(studies.Ledger(storage), everything)
            url = rdb.shown_url(storage)
            if url is not None and url != self.remembered():
                atomic_write_text(str(self.root / LEDGER_FILE), json.dumps({"storage": url}))
        return self.root / "trials.csv", self.root / "recommendations.csv"

    def remembered(self) -> Optional[str]:
        """The database this folder is a view of (``.ledger.json``: its URL without a
        password, written by a sync or sweep that used one), or None."""
        try:
            url = json.loads((self.root / LEDGER_FILE).read_text())["storage"]
            return url if isinstance(url, str) else None
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def refresh(self) -> None:
        """Before a command reads the tables: sync them from the database this folder is a
        view of (given, or ``remembered``) if it says (asked without optuna) a key changed;
        nothing for a journal folder, whose tables every writer keeps current."""
        from hcp_tune.store import rdb

        url = self.storage if rdb.is_rdb(self.storage) else self.remembered()
        if not rdb.is_rdb(url):
            return
        with rdb.Quick(url) as quick:
            slugs, meta = self._db_slugs(quick, rdb.redacted(url))
        index = self._read_index(meta)
        if index is None or _dirty(index, slugs, meta["touched"]):
            self.rebuild(url)

    def rebuild_locked(self, ledger: Any, everything: bool) -> None:
        """``rebuild``'s work; the caller holds the lock."""
        slugs, meta = self._slugs(ledger)
        index = None if everything or slugs is None else self._read_index(meta)
        touched = meta.pop("touched", set())
        if index is None:
            dirty = set(slugs) if slugs is not None else None
            keep: dict[str, dict[str, Any]] = {}
        else:
            dirty = _dirty(index, slugs, touched)
            keep = {s: e for s, e in index["slugs"].items() if s in slugs and s not in dirty}
        derived = self._derive(ledger, dirty)
        made = self._folder_times()  # after the derive (``_settled``)
        for s, e in derived.items():  # what it was derived from, read before: a trial
            e["stat"] = _settled((slugs or {}).get(s), made.get(s, 0))  # added meanwhile: changed
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
        self._write_tables(entries, index, extras, derived, meta)

    def _slugs(self, ledger: Any) -> tuple[Optional[dict[str, list[int]]], dict[str, Any]]:
        """Each key folder (by slug) with a study or a row folder, and what says it changed
        (last, two times: a journal's or 0, the row folder's; a database's keys: counts of
        ``rdb.slug_changes``), what the index must match (``meta``); (None, {}): derive all."""
        from hcp_tune.store import rdb
        from hcp_tune.store.journals import Journals

        if isinstance(ledger.storage, Journals):
            out: dict[str, list[int]] = {s: [0, 0, t] for s, t in self._folder_times().items()}
            for path in ledger.storage.folder.glob("*.journal"):
                st = path.stat()
                out.setdefault(path.stem, [0, 0, 0])[:2] = [st.st_size, st.st_mtime_ns]
            return out, {"ledger": JOURNALS, "touched": set()}
        url = rdb.shown_url(ledger.storage)
        return (None, {}) if url is None else self._db_slugs(ledger.storage, url)

    def _db_slugs(self, db: Any, url: str) -> tuple[dict[str, list[int]], dict[str, Any]]:
        """``_slugs`` of a database (an RDB storage, or ``rdb.Quick``: ``rdb.slug_changes``)."""
        from hcp_tune.store import rdb

        index = self._read_index({"ledger": url}) or {}
        stats, touched, mark = rdb.slug_changes(db, index.get("mark", 0))
        out = {s: [0, 0, 0, 0, t] for s, t in self._folder_times().items()}
        for s, st in stats.items():
            out.setdefault(s, [0, 0, 0, 0, 0])[:4] = [*st, 0]
        return out, {"ledger": url, "mark": mark, "touched": touched}

    def _folder_times(self) -> dict[str, int]:  # each row folder's time
        return {p.name: p.stat().st_mtime_ns for p in (self.root / "rows").glob("*/")}

    def _derive(self, ledger: Any, slugs: Optional[set[str]]) -> dict[str, dict[str, Any]]:
        """For the key folders ``slugs`` (None: every key the storage or ``rows/`` holds),
        one key at a time: import the row files its study lacks, rewrite its row files
        from the study, and return per slug its tables' entry (``_entry``). A per-key
        journal is let go once its key is done, so memory holds one key's trials."""
        from hcp_tune.store.journals import Journals

        journals = ledger.storage if isinstance(ledger.storage, Journals) else None
        in_storage: dict[str, set[str]] = {}
        if journals is None:  # one storage: its study names, by slug
            for n in ledger.names():
                in_storage.setdefault(name_slug(n), set()).add(n)
        if slugs is None:
            folders = self.root / "rows"
            slugs = {*in_storage, *(journals.slugs() if journals else ()),
                     *(p.name for p in folders.iterdir() if p.is_dir())} \
                if folders.is_dir() else {*in_storage, *(journals.slugs() if journals else ())}
        out: dict[str, dict[str, Any]] = {s: table_entry([], "") for s in slugs}
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
                    out[name_slug(name)] = table_entry(rows, ledger.pareto(name, {name}))
                if journals is not None:
                    journals.forget(name)
        return out

    def _read_index(self, meta: dict[str, Any]) -> Optional[dict[str, Any]]:
        """``.tables.json`` if it describes the tables on disk, derived from ``meta``'s ledger."""
        try:
            index = json.loads((self.root / TABLES_INDEX).read_text())
            if index.get("version") != TABLES_INDEX_VERSION \
                    or index.get("ledger", JOURNALS) != meta.get("ledger"):
                return None
            for name in ("trials.csv", "recommendations.csv"):
                st = (self.root / name).stat()
                if [st.st_size, st.st_mtime_ns] != index["bytes"][name]:
                    return None  # written by something else since
            return index
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def _write_tables(self, entries: dict[str, dict[str, Any]], index: Optional[dict[str, Any]],
                      extras: list[str], derived: dict[str, dict[str, Any]],
                      meta: dict[str, Any]) -> None:
        """trials.csv: the header, then each key's rows in slug order (a kept key's lines
        copied from the old table); recommendations.csv: one line per key in key order;
        then the index. Each written atomically."""
        columns = [*TRIAL_COLUMNS, *extras]
        header = csv_line(columns)
        t_path, r_path = self.root / "trials.csv", self.root / "recommendations.csv"
        with atomic_open(str(t_path), "wb") as out, \
                (open(t_path, "rb") if index is not None else io.BytesIO()) as old:
            pos = out.write(header.encode())
            for slug in sorted(entries):
                e = entries[slug]
                if slug in derived or index is None:
                    data = "".join(
                        base + "".join("," + quoted_cell(csv_cell(more.get(c))) for c in extras)
                        + "\n" for base, more in e.pop("rows")).encode()
                else:
                    start, end = e["span"]
                    old.seek(start)
                    data = old.read(end - start)
                e["span"] = [pos, pos + len(data)]
                pos += out.write(data)
        recs = sorted((e["order"], e["rec"]) for e in entries.values() if e["rec"])
        atomic_write_text(str(r_path), csv_line(list(RECOMMENDATION_COLUMNS))
                          + "".join(line for _, line in recs))
        atomic_write_text(str(self.root / TABLES_INDEX), json.dumps({
            "version": TABLES_INDEX_VERSION, "extras": extras, **meta,
            "bytes": {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in (t_path, r_path)},
            "slugs": entries}, separators=(",", ":")))

    # ---------------------------------------------------------------- housekeeping
    def recommendations(self) -> list[dict[str, Any]]:
        """recommendations.csv as dicts (``records.Recommendation``: a table of an older
        version reads with defaults, one of a newer version raises ``ResultsTooNew``)."""
        path = self.root / "recommendations.csv"
        try:
            with open(path, newline="") as handle:
                recs = [{k: read_cell(k, v) for k, v in r.items()}
                        for r in csv.DictReader(handle)]
        except FileNotFoundError:
            return []
        return [Recommendation.from_dict(r, where=str(path)).to_dict() for r in recs]


LEGACY_JOURNAL = "optuna.journal"  # the single journal of folders written before issue 20
JOURNALS = "journals"  # one journal per sweep key: journals/<slug>.journal
LEDGER_FILE = ".ledger.json"  # the database this folder is a view of (ResultStore.remembered)
TABLES_INDEX, TABLES_INDEX_VERSION = ".tables.json", 1  # each key's lines in the tables
RACY_NS = 2_000_000_000  # a time this recent may not yet show a write made in its tick


def _dirty(index: dict[str, Any], slugs: dict[str, list[int]], touched: set[str]) -> set[str]:
    """The keys whose stat differs from the index's (or that are new), and ``touched``."""
    return {s for s, st in slugs.items() if index["slugs"].get(s, {}).get("stat") != st} | touched


def _settled(stat: Optional[list[int]], made: int = 0) -> Optional[list[int]]:
    """A key's stat (``_slugs``: its last two numbers are times) as the index keeps it, or
    None when a time is within ``RACY_NS`` of now (a row file written in the same coarse
    tick as the snapshot leaves the folder's time unchanged: derive it again next time).
    ``made``: the row folder's time after the derive, kept where the derive made the folder
    and for a database's view (5 numbers; a row added there is told to the database too)."""
    if stat and (len(stat) == 5 or not stat[-1]):
        stat = stat[:-1] + [made]
        if len(stat) == 5:
            return stat
    if stat is None or max(stat[-2], stat[-1]) > time.time_ns() - RACY_NS:
        return None
    return stat
