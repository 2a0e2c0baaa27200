"""A database server as the ledger (``search.storage=postgresql://...``): opening it, riding
out a restart, and asking it what changed.

- ``driver_url``: ``postgresql://`` means the psycopg 3 driver (``pip install hcp-tune[postgres]``);
  a URL naming its driver (``postgresql+psycopg2://``, ``sqlite:///``) is used as given.
- ``open_storage``: optuna's ``RDBStorage`` with a connection checked before each use
  (``pool_pre_ping``: a server restarted between two calls costs a reconnect) and a short
  connect timeout. A server that refuses the login or cannot be reached is one line
  (``LedgerUnavailable``, exit 2) before anything is written.
- A call that loses its connection (the server restarted mid-sweep) is retried with
  backoff for up to ``HCP_TUNE_DB_RETRY_S`` (default 120 s); past that the command stops
  with one line saying what to re-run (a sweep resumes: its rows are on disk first).
- ``slug_changes``: per study, what says its trials changed (count, newest id, finished
  count, and whether a user attribute was added since the last look), in three queries, so
  a folder syncs only the keys that changed (``store.ResultStore.rebuild``); ``Quick``
  asks them with psycopg alone, for a command that only needs to know (``refresh``).
"""
from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any, Callable, Optional

from hcp_tune.errors import HcpError
from hcp_tune.redact import redact

CONNECT_TIMEOUT_S = 5  # an unreachable host: one line after this, not a hang
RETRY_S = 120.0  # a lost connection is retried this long (HCP_TUNE_DB_RETRY_S)
BACKOFF_S = (0.5, 10.0)  # the first wait between tries, and the longest
OPEN_TRIES = 3  # opening: a lost race to create optuna's tables is tried again


class LedgerUnavailable(HcpError):
    """The database named by ``search.storage`` cannot be used (login refused, host not
    reachable, driver missing, lost for longer than the retry period): one line."""


def redacted(url: str) -> str:
    """``url`` without its password (what may be printed, or kept in a results folder:
    the password then comes from ~/.pgpass or PGPASSWORD): ``hcp_tune.redact``."""
    return redact(url)


def is_rdb(storage: Any) -> bool:
    return isinstance(storage, str) and "://" in storage


def driver_url(url: str) -> str:
    """``postgresql://`` (and ``postgres://``) with the psycopg 3 driver named; a URL that
    names its driver, or another database's, is returned as it is."""
    scheme, sep, rest = url.partition("://")
    if scheme in ("postgresql", "postgres"):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise LedgerUnavailable(
                f"search.storage={redacted(url)}: PostgreSQL needs the psycopg driver: "
                "pip install 'hcp-tune[postgres]'") from None
        return f"postgresql+psycopg{sep}{rest}"
    return url


def open_storage(url: str) -> Any:
    """optuna's RDB storage at ``url``, whose calls ride out a lost connection; raises
    ``LedgerUnavailable`` (one line) when the server cannot be used."""
    from optuna.storages import RDBStorage

    full = driver_url(url)
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if full.startswith("postgresql"):
        kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    for attempt in range(OPEN_TRIES):
        try:
            storage = _Retrying(full, engine_kwargs=kwargs)
            break
        except Exception as e:  # noqa: BLE001 - every failure to open is the user's to fix
            if not _connection_lost(e) and attempt + 1 < OPEN_TRIES:
                # two users opening an empty database at once both create optuna's
                # tables: one of them loses that race; the tables exist on its next try
                time.sleep(BACKOFF_S[0] * (attempt + 1))
                continue
            raise LedgerUnavailable(
                f"search.storage={redacted(url)}: cannot use the database: "
                f"{_reason(e)}; check the URL, the password (~/.pgpass or PGPASSWORD) and that "
                "the server runs") from None
    storage.shown_url = redacted(url)
    return storage


def check(url: str) -> None:
    """Open ``url`` once (``open_storage``'s one line on failure), before a command writes
    anything."""
    if is_rdb(url):
        open_storage(url).engine.dispose()


def _reason(e: BaseException) -> str:
    """The first line of the driver's own message (e.g. 'password authentication failed
    for user "hcp"', 'Connection refused'), without SQLAlchemy's boilerplate."""
    inner = getattr(e, "orig", None) or e.__cause__ or e
    text = " ".join(str(inner).split())
    for cut in (" (Background on this error", "\n"):
        text = text.split(cut)[0]
    return text[:300] or type(e).__name__


def _connection_lost(e: BaseException) -> bool:
    """A server that went away (restart, network), not a bad statement."""
    from sqlalchemy import exc

    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (exc.OperationalError, exc.InterfaceError, exc.DisconnectionError)) \
                or getattr(e, "connection_invalidated", False):
            return True
        e = e.__cause__ or e.__context__
    return False


def _retry(method: Callable) -> Callable:
    @functools.wraps(method)
    def call(self, *args: Any, **kwargs: Any) -> Any:
        limit = float(os.environ.get("HCP_TUNE_DB_RETRY_S", RETRY_S))
        start, wait, lost = time.monotonic(), BACKOFF_S[0], None
        while True:
            try:
                return method(self, *args, **kwargs)
            except Exception as e:  # noqa: BLE001 - only a lost connection is retried
                if type(e).__name__ == "UpdateFinishedTrialError" and lost is not None:
                    return True  # the lost call had finished the trial after all
                if not _connection_lost(e):
                    raise
                lost = e
            if time.monotonic() - start + wait > limit:
                raise LedgerUnavailable(
                    f"the ledger {getattr(self, 'shown_url', '')} did not answer for "
                    f"{limit:.0f} s ({_reason(lost)}): stopped; every trial measured so far is "
                    "in the results folder's rows/; when the database is back, re-run the same "
                    "command (a sweep resumes where it stopped)")
            print(f"hcp-tune: the ledger database did not answer ({_reason(lost)}); "
                  f"retrying in {wait:.1f} s (for up to {limit:.0f} s)", file=sys.stderr)
            time.sleep(wait)  # backoff while the server is away
            wait = min(wait * 2, BACKOFF_S[1])
    return call


def _retrying_class() -> type:
    from optuna.storages import BaseStorage, RDBStorage

    def late(name: str) -> Callable:  # RDBStorage's method, looked up at each call
        return lambda self, *a, **kw: getattr(RDBStorage, name)(self, *a, **kw)

    names = {n for n in dir(BaseStorage) if not n.startswith("_")} | CACHE_CALLS \
        | {n for n in vars(RDBStorage) if not n.startswith("_") and callable(vars(RDBStorage)[n])}
    body = {n: _retry(late(n)) for n in sorted(names)
            if callable(getattr(RDBStorage, n, None)) and n not in RDB_NOT_RETRIED}
    return type("RetryingRDBStorage", (RDBStorage,), body)


# what optuna's cache (``_CachedStorage``) calls on the RDB storage besides its public methods
CACHE_CALLS = {"_create_new_trial", "_set_trial_param", "_get_best_trial_id", "_get_trials",
               "_get_stale_trial_ids"}
RDB_NOT_RETRIED = {"remove_session", "get_heartbeat_interval", "get_failed_trial_callback",
                   "is_heartbeat_enabled", "check_trial_is_updatable"}


class _Lazy:
    cls: Optional[type] = None


def _Retrying(url: str, **kwargs: Any) -> Any:  # noqa: N802 - a class, built on first use
    if _Lazy.cls is None:
        _Lazy.cls = _retrying_class()
    return _Lazy.cls(url, **kwargs)


# ---------------------------------------------------------------- what changed
def backend(storage: Any) -> Any:
    """The RDB storage under optuna's cache (``_CachedStorage``), or None."""
    inner = getattr(storage, "_backend", storage)
    return inner if getattr(inner, "engine", None) is not None else None


def shown_url(storage: Any) -> Optional[str]:
    """The URL (password hidden) of an RDB storage; None for another storage."""
    inner = backend(storage)
    if inner is None:
        return None
    return getattr(inner, "shown_url", None) or redacted(str(inner.url))


class Quick:
    """A connection for asking what changed, without optuna or SQLAlchemy (their imports
    cost more than the question): psycopg for PostgreSQL, else a SQLAlchemy engine."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.pg = url.partition("://")[0] in ("postgresql", "postgres")
        try:
            if self.pg:
                driver_url(url)  # psycopg installed, or one line
                import psycopg

                self.conn = psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S,
                                            autocommit=True)
            else:
                from sqlalchemy import create_engine

                self.conn = create_engine(url).connect()
        except LedgerUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 - every failure to connect is the user's to fix
            raise LedgerUnavailable(
                f"search.storage={redacted(url)}: cannot use the database: {_reason(e)}; "
                "check the URL, the password (~/.pgpass or PGPASSWORD) and that the server "
                "runs") from None

    def rows(self, sql: str, **params: Any) -> list[tuple]:
        if self.pg:
            return list(self.conn.execute(sql.replace(":mark", "%(mark)s"), params))
        from sqlalchemy import text

        return [tuple(r) for r in self.conn.execute(text(sql), params)]

    def __enter__(self) -> "Quick":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.conn.close()


def slug_changes(storage: Any, mark: int) -> tuple[dict[str, list[int]], set[str], int]:
    """(per key slug: [trials, newest trial id, finished trials], the slugs of the studies
    given a user attribute since ``mark`` (0: not asked), the newest user attribute id):
    three queries over optuna's tables, whose cost does not grow with the trials synced
    before. ``storage``: an RDB storage, or a ``Quick`` connection."""
    from hcp_tune.store.records import name_slug

    newest = "SELECT coalesce(max(trial_user_attribute_id), 0) FROM trial_user_attributes"
    trials = ("SELECT s.study_name, count(t.trial_id), coalesce(max(t.trial_id), 0), "
              "count(t.datetime_complete) FROM studies s LEFT JOIN trials t "
              "ON t.study_id = s.study_id GROUP BY s.study_name")
    attrs = ("SELECT DISTINCT s.study_name FROM trial_user_attributes a "
             "JOIN trials t ON t.trial_id = a.trial_id "
             "JOIN studies s ON s.study_id = t.study_id "
             "WHERE a.trial_user_attribute_id > :mark")

    def answer(ask: Callable[..., list[tuple]]) -> tuple[dict[str, list[int]], set[str], int]:
        top = int(ask(newest)[0][0] or 0)  # first: an attribute added later is seen next
        stats = {name_slug(r[0]): [int(r[1]), int(r[2]), int(r[3])] for r in ask(trials)}
        touched = {name_slug(r[0]) for r in ask(attrs, mark=mark)} if 0 < mark < top else set()
        return stats, touched, top

    if isinstance(storage, Quick):
        return answer(storage.rows)

    def read(_self: Any) -> tuple[dict[str, list[int]], set[str], int]:
        from sqlalchemy import text

        with backend(storage).engine.connect() as conn:
            return answer(lambda sql, **p: [tuple(r) for r in conn.execute(text(sql), p)])

    return _retry(read)(storage)
