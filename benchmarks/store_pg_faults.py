"""store_pg's fault cases (issue 32): a wrong password and an unreachable host (one line,
exit 2, nothing written); the server restarted while a writer tells trials (retried with
backoff: nothing lost); the server down longer than the retry period (the writer stops with
one line; the re-run, ``results sync``, imports what was measured meanwhile). A writer is
a child process that tells trials the way a sweep does. Run by ``store_pg.py``.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import store_gen

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SCRIPT = REPO / "scripts" / "postgres-local.sh"


def sh(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, **kw)


WRITER = """
import sys, json
sys.path.insert(0, {bench!r})
import store_gen
from hcp_tune.store import studies
from hcp_tune.store.folder import ResultStore
from hcp_tune.errors import HcpError
url, folder, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
key = store_gen.key_of(0, 0)
store = ResultStore(folder)
try:
    study = studies.LayoutStudy(store.ledger(url), key.name, store_gen.kept_a2a(key.tp))
    for i in range(n):
        number, trial_id, a2a = study.ask(2, "writer-" + folder.rsplit("/", 1)[-1])
        row = store_gen.synthetic_row(key, 10**6 + i, a2a)
        row["trial_id"] = trial_id
        store.add(row, key)  # the row file first, as a sweep does
        study.tell(number, None, None, row=row)
        print("told", i, trial_id, flush=True)
except HcpError as e:
    print("hcp-tune: error:", e, file=sys.stderr)
    sys.exit(e.exit_code)
"""


def writer(url: str, folder: Path, n: int, retry_s: float, env: dict) -> subprocess.Popen:
    env = {**env, "HCP_TUNE_DB_RETRY_S": str(retry_s)}
    return subprocess.Popen([sys.executable, "-c", WRITER.format(bench=str(HERE)),
                             url, str(folder), str(n)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)


def wait_told(proc: subprocess.Popen, k: int) -> list[str]:
    lines = []
    while len(lines) < k:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
    return lines


def count_in_db(url: str, prefix: str) -> int:
    from hcp_tune.store import journals, studies

    rows = studies.Ledger(journals.open_storage(url)).rows([store_gen.key_of(0, 0).name])
    return sum(1 for (_, tid) in rows if tid.startswith(prefix))  # (the writers' key)


def faults(base: str, url: str, tmp: Path, hcp: Callable[..., dict], env: dict) -> dict:
    """The four cases' figures; ``hcp`` runs one timed command (store_pg.hcp)."""
    out = {}
    port = base.split("port=")[1]
    for name, bad in (("wrong password", f"postgresql://hcp:wrong@127.0.0.1:{port}/hcp"),
                      ("unreachable host", "postgresql://hcp:x@127.0.0.1:1/hcp")):
        folder = tmp / name.replace(" ", "-")
        r = hcp("results", "sync", f"results_dir={folder}", f"search.storage={bad}")
        out[name] = {**r, "written": folder.exists()}
    # the server restarted while a writer tells trials: retried, nothing lost
    folder = tmp / "restart"
    proc = writer(url, folder, 30, retry_s=120, env=env)
    first = wait_told(proc, 10)
    t0 = time.perf_counter()
    restart = sh(str(SCRIPT), "restart", timeout=120)
    restart_s = time.perf_counter() - t0
    rest, err = proc.communicate(timeout=600)
    out["restart"] = {"rc": proc.returncode, "restart_rc": restart.returncode,
                      "restart_s": restart_s, "told": len(first) + len(rest.splitlines()),
                      "retries": sum("retrying" in line for line in err.splitlines()),
                      "in_db": count_in_db(url, "writer-restart")}
    # down longer than the retry period (3 s): one line, what to re-run; the re-run imports
    folder = tmp / "outage"
    proc = writer(url, folder, 30, retry_s=3, env=env)
    first = wait_told(proc, 5)
    halt = sh(str(SCRIPT), "halt", timeout=120)
    rest, err = proc.communicate(timeout=600)
    lines = [x for x in err.splitlines() if "retrying" not in x]
    start = sh(str(SCRIPT), "start", timeout=300)
    files = len(list(folder.glob("rows/*/*.json")))
    rerun = hcp("results", "sync", f"results_dir={folder}", f"search.storage={url}")
    out["outage"] = {"rc": proc.returncode, "halt_rc": halt.returncode,
                     "start_rc": start.returncode, "told": len(first) + len(rest.splitlines()),
                     "lines": lines, "row_files": files, "rerun_rc": rerun["rc"],
                     "in_db_after_rerun": count_in_db(url, "writer-outage")}
    return out
