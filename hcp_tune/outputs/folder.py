"""``results``: what a results folder holds, per env tag: its keys, stored trials and bytes.

Read from the row folders alone (``ResultStore.folder_keys``: one row per key folder names
its key; a folder's files are its trials), never the optuna journals, whose replay grows
with every trial stored: the answer costs a directory listing, not the folder's history.
No torch, no pandas.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hcp_tune.outputs.regress import RegressError
from hcp_tune.outputs.regress.args import parse_args
from hcp_tune.store.records import ROW_FILES

RESULTS_KEYS = ("results_dir", "format")
TAKE_ACTIONS = ("drop", "archive")  # results drop|archive env_tag=X [results_dir=PATH]
TAKE_KEYS = ("env_tag", "results_dir")
LEDGER_ACTIONS = ("sync", "migrate")  # results sync|migrate [search.storage=URL] [results_dir=..]
# search.storage: the name sweep and recommend take; storage=, this command's first name,
# is still read (scripts written with it), and the docs name only search.storage
LEDGER_KEYS = ("search.storage", "results_dir", "storage")


@dataclass
class TagSummary:
    env_tag: str
    keys: int = 0
    trials: int = 0  # row files: measured, failed, pruned and skipped trials
    bytes: int = 0  # of its row files
    clusters: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)


def summarize(results_dir: Path) -> dict:
    """Per env tag, its keys, trials and row bytes; the folder's other files' bytes (the
    journal, the tables, job logs) as ``other_bytes``."""
    from hcp_tune.store.folder import ResultStore

    store = ResultStore(results_dir)
    tags: dict[str, TagSummary] = {}
    row_bytes = 0
    for slug, key in store.folder_keys().items():
        s = tags.setdefault(str(key.env_tag), TagSummary(str(key.env_tag)))
        files = list((results_dir / "rows" / slug).glob(ROW_FILES))
        size = sum(p.stat().st_size for p in files)
        s.keys += 1
        s.trials += len(files)
        s.bytes += size
        row_bytes += size
        s.clusters = sorted({*s.clusters, str(key.cluster)})
        s.models = sorted({*s.models, str(key.model)})
    total = sum(p.stat().st_size for p in results_dir.rglob("*") if p.is_file())
    # the ledger: one journal per key (journals/), or an older folder's single journal
    journals = [*(results_dir / "journals").glob("*.journal"), results_dir / "optuna.journal"]
    return {"results_dir": str(results_dir),
            "tags": [asdict(tags[t]) for t in sorted(tags)],
            "journal_bytes": sum(p.stat().st_size for p in journals if p.is_file()),
            "other_bytes": total - row_bytes, "total_bytes": total}


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def cmd_results(args: list[str]) -> int:
    if args and args[0] in TAKE_ACTIONS:
        return cmd_take(args[0], args[1:])
    if args and args[0] in LEDGER_ACTIONS:
        return cmd_ledger(args[0], args[1:])
    a = parse_args("results", args, RESULTS_KEYS)
    results_dir = _folder(a)
    fmt = a.get("format", "table")
    if fmt not in ("table", "json"):
        raise RegressError(f"format={fmt!r}: expected table or json")
    doc = summarize(results_dir)
    if fmt == "json":
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{results_dir}: {sum(t['trials'] for t in doc['tags'])} trial(s) in "
          f"{sum(t['keys'] for t in doc['tags'])} key(s) under {len(doc['tags'])} env tag(s); "
          f"{_mb(doc['total_bytes'])} ({_mb(doc['journal_bytes'])} journal)")
    if doc["tags"]:
        print(f"{'env_tag':<24} {'keys':>6} {'trials':>8} {'rows':>10}  clusters / models")
    for t in doc["tags"]:
        print(f"{t['env_tag']:<24} {t['keys']:>6} {t['trials']:>8} {_mb(t['bytes']):>10}  "
              f"{', '.join(t['clusters'])} / {', '.join(t['models'])}")
    return 0


def _folder(a: dict[str, str]) -> Path:
    from hcp_tune.config import existing_dir

    return existing_dir(Path(a.get("results_dir", "results")).resolve())


def cmd_take(action: str, args: list[str]) -> int:
    """``results drop env_tag=X`` deletes a tag's trials (row files and journals) and
    their table lines; ``results archive env_tag=X`` moves them to
    ``<results_dir>/archive/X/`` (a results folder of its own). Both hold the folder's
    lock and refuse while a sweep runs on it (``housekeeping.take_tag``)."""
    from hcp_tune.store.housekeeping import take_tag
    from hcp_tune.store.folder import ResultStore

    a = parse_args(f"results {action}", args, TAKE_KEYS)
    results_dir = _folder(a)
    if "env_tag" not in a:
        raise RegressError(f"results {action}: which tag? give env_tag=TAG (see: results "
                           f"results_dir={results_dir})")
    keys, files, where = take_tag(ResultStore(results_dir), a["env_tag"], action == "archive")
    done = f"archived to {where}" if where else "dropped"
    print(f"env_tag={a['env_tag']}: {keys} key(s), {files} trial row(s) {done}; the tables "
          "no longer list them")
    return 0


def _unquoted(value):
    """A URL as Hydra's commands take it quoted (``search.storage='postgresql://...'``)
    is the same URL here, where nothing parses it."""
    if value and len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def cmd_ledger(action: str, args: list[str]) -> int:
    """``results sync [search.storage=URL]``: bring the folder's row files and tables up
    to date from a team's database (only the keys that changed); the folder remembers the
    database, so later commands sync by themselves. ``results migrate
    search.storage=URL``: move the folder's journals into the database once, with a count
    check (``housekeeping.migrate``)."""
    from hcp_tune.store.folder import ResultStore

    a = parse_args(f"results {action}", args, LEDGER_KEYS)
    results_dir = Path(a.get("results_dir", "results")).resolve()
    given = _unquoted(a.get("search.storage") or a.get("storage"))
    store = ResultStore(results_dir, given)
    url = given or store.remembered()
    if not url or "://" not in url:
        raise RegressError(f"results {action}: which database? give search.storage="
                           "postgresql://USER@HOST/DB (the password from ~/.pgpass or "
                           "PGPASSWORD)")
    if action == "migrate":
        from hcp_tune.store.housekeeping import migrate

        if not results_dir.is_dir():
            _folder(a)  # raises: no such folder
        studies, copied, already = migrate(store, url)
        print(f"{results_dir}: {studies} studies migrated to {store.remembered()}: {copied} "
              f"trial(s) copied, {already} already there; count check passed (every stored "
              "row is in the database); the folder now syncs from it")
        return 0
    store.refresh()  # only the keys that changed (none: nothing written)
    trials = sum(1 for _ in open(results_dir / "trials.csv")) - 1
    print(f"{results_dir}: synced from {store.remembered()}: trials.csv holds {trials} "
          "trial(s)")
    return 0
