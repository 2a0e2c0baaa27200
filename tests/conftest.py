"""Shared fixtures: ``slurm_cluster`` makes sure the local SLURM cluster answers; ``batch``
and ``make_spec`` build TrialSpecs for the tiny models the way the orchestrator does.

The cluster comes from scripts/slurm-local.sh (started here when sinfo does not answer).
If it cannot come up the slurm tests skip, with the reason; with HCP_TUNE_REQUIRE_SLURM=1
(CI) they fail instead, so a broken cluster never passes as skipped tests.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import helpers  # noqa: E402
from helpers import kept_layouts, make_spec  # noqa: E402

cloudpickle.register_pickle_by_value(helpers)  # jobs unpickle without the tests folder

REPO = Path(__file__).resolve().parents[1]


def _node_ready() -> bool:
    if not (shutil.which("sinfo") and shutil.which("sbatch")):
        return False
    out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=30)
    return out.returncode == 0 and any(s in out.stdout for s in ("idle", "mix", "alloc"))


def _missing(reason: str, require_var: str) -> None:
    """A service the tests need is not there: skip, or fail where ``require_var`` is 1 (CI)."""
    if os.environ.get(require_var) == "1":
        pytest.fail(f"{reason} [{require_var}=1]", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local cluster: used as it is when it answers; otherwise started here and stopped
    again when the session ends, also when it is interrupted (pytest finalises session
    fixtures on Ctrl-C), so a test run leaves no daemon it started behind."""
    if _node_ready():
        yield
        return
    if os.environ.get("HCP_TUNE_QUICK") == "1":
        pytest.skip("scripts/test.sh quick: no SLURM (it needs root and apt)")
    script = REPO / "scripts" / "slurm-local.sh"
    run = subprocess.run([str(script), "start"], capture_output=True, text=True, timeout=900)
    if run.returncode != 0:
        tail = " | ".join((run.stdout + run.stderr).strip().splitlines()[-3:])
        _missing(f"local SLURM cluster did not come up ({script} start exited "
                 f"{run.returncode}): {tail}", "HCP_TUNE_REQUIRE_SLURM")
    try:
        yield
    finally:
        subprocess.run([str(script), "stop"], capture_output=True, text=True, timeout=120)


from hcp_tune.space.layout import Layout  # noqa: E402


@pytest.fixture
def spec_factory():
    return make_spec


# ---------------------------------------------------------------- process batches
# Start-up (torch + Megatron-Core imports in every process) costs far more than a tiny
# trial, so trials of one world size run in one batch of processes (groups torn down
# between them), once per session; tests look their trial up by id. A FAILED trial makes
# the rest of its batch SKIPPED, so the failing ones come last.

def _layout_specs(model, cp, tp, seq):
    return [make_spec(lay, model=model, tp=tp, seq=seq)
            for lay in kept_layouts(model, cp=cp, tp=tp, seq=seq)]


HCP4 = Layout(2, 2)

BATCHES = {
    "world2": lambda: _layout_specs("tiny", 2, 1, 128)
    + [make_spec(Layout(1, 2), trial_id="time-limit", time_limit_s=0.0)],
    "world4": lambda: _layout_specs("tiny", 4, 1, 256) + _layout_specs("tiny", 2, 2, 128)
    + [make_spec(HCP4, model="tiny-gqa", seq=256)]
    + [make_spec(HCP4, inject_fault=f) for f in ("cp_off", "no_groups", "raise")]
    + [make_spec(HCP4, trial_id="after-raise")],
    "world8": lambda: _layout_specs("tiny", 8, 1, 256),
}


@pytest.fixture(scope="session")
def batch(tmp_path_factory):
    """batch(name) -> {trial_id: (spec, result)}, each batch run once per session."""
    from hcp_tune.engine.launch import run_local_batch

    cache = {}

    def get(name):
        if name not in cache:
            specs = BATCHES[name]()
            results = run_local_batch(specs, workdir=tmp_path_factory.mktemp(name))
            cache[name] = {s.trial_id: (s, r) for s, r in zip(specs, results)}
        return cache[name]

    return get


def pytest_configure(config):
    """Tests send SIGINT (Ctrl-C of a sweep; submitit's local cancel). A shell that starts
    the suite in the background (``nohup ... &``) hands every child SIGINT *ignored*, which
    children inherit through exec; restore the default so the tests behave as in a terminal."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if hasattr(config, "workerinput"):  # an xdist worker: its bootstrap exports COLUMNS=80
        # (and LINES), which the CLI's prose would wrap at (outputs/ui.py piped_width); the
        # tests expect what a single process gives them: no COLUMNS unless a test sets it
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)


@pytest.fixture
def fake_srun(tmp_path, monkeypatch):
    """submitit's SlurmExecutor only checks that srun exists."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


# ---------------------------------------------------------------- PostgreSQL
# A throwaway server from scripts/postgres-local.sh (Debian's postgresql; a Unix socket),
# started here when it does not answer and stopped at the end of the session if this
# session started it. If it cannot come up the PostgreSQL tests skip, with the reason;
# with HCP_TUNE_REQUIRE_POSTGRES=1 (CI) they fail instead.

@pytest.fixture(scope="session")
def postgres_server():
    script = REPO / "scripts" / "postgres-local.sh"
    started = False
    if subprocess.run([str(script), "status"], capture_output=True).returncode != 0:
        run = subprocess.run([str(script), "start"], capture_output=True, text=True, timeout=900)
        if run.returncode != 0:
            tail = " | ".join((run.stdout + run.stderr).strip().splitlines()[-3:])
            _missing(f"PostgreSQL did not come up ({script} start exited {run.returncode}): "
                     f"{tail}", "HCP_TUNE_REQUIRE_POSTGRES")
        started = True
    url = subprocess.run([str(script), "url"], capture_output=True, text=True).stdout.strip()
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _missing("psycopg is not installed (pip install -e '.[postgres]')",
                 "HCP_TUNE_REQUIRE_POSTGRES")
    try:
        yield url
    finally:  # a server this session started goes, on Ctrl-C too (as the SLURM cluster)
        if started:
            subprocess.run([str(script), "stop"], capture_output=True, timeout=120)


@pytest.fixture
def postgres_db(postgres_server):
    """A fresh, empty database on the server, for one test: its URL."""
    import uuid

    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    dsn = postgres_server
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield postgres_server.replace("/hcp?", f"/{name}?", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# ---------------------------------------------------------------- two workers (pytest-xdist)
# scripts/test.sh runs the suite in two worker processes (``-n 2 --dist loadgroup``): much
# of a test's time is spent waiting on SLURM, on process start-up and on subprocesses, so a
# second worker fills those waits. Every test gets a group, and a group runs in one worker:
# the tests that use the local SLURM node are one group (one after the other, as alone:
# some read its free slots), the PostgreSQL ones another, those sharing the session's
# ``batch`` runs a third, and every other test stays with its file's tests (module
# fixtures run once). Without xdist the mark is inert. The marks must be there before
# xdist's own hook turns each into the test id's ``@group`` suffix, which is what its
# scheduler groups by; ``_groups_formed`` then checks that it did (2026-12-07: under
# pytest 9.2, which xdist 3.8's suffix no longer reaches, no group formed and the restart
# test's worker cut the other worker's PostgreSQL sweeps: pyproject pins pytest < 9.2).

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if "slurm_cluster" in names or item.get_closest_marker("slurm"):
            group = "slurm"
        elif names & {"postgres_server", "postgres_db"} or item.get_closest_marker("postgres"):
            group = "postgres"
        elif "batch" in names:
            group = "batch"
        else:
            group = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_finish(session):
    """In an xdist worker with ``--dist loadgroup``: every test id carries its group, or
    the run stops before a test runs (two workers would share the SLURM node and the
    PostgreSQL server, and fail at random)."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    for item in session.items:
        group = "_".join(sorted({m.args[0] for m in item.iter_markers("xdist_group")}))
        if not item.nodeid.endswith(f"@{group}"):
            raise pytest.UsageError(
                f"pytest-xdist formed no test groups ({item.nodeid} lacks @{group}): this "
                "pytest and pytest-xdist do not work together (pyproject pins pytest < 9.2)")
