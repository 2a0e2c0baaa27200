"""The tests' one helpers module: what several test modules share (test modules never
import each other). Fixtures live in conftest.py, which uses these.

- trial specs for the tiny models, built the way the orchestrator builds them (``make_spec``)
- job bodies for the dispatch tests (``double``, ``boom``, ...): pickled by value, so a job
  does not need the tests folder on its path (conftest registers this module)
- sweeps through the CLI in real processes (``hcp``, ``start``, ``wait_for``, ``rows``, ...)
- recorded-style rows written by the store's own ``trial_row`` (``row``, ``rows_for``,
  ``store``; ``CUDA_MEM``/``CPU_MEM`` the jobs' memory notes), the committed pool of
  recorded CPU trials (``pool_rows``) and bare rows for the ranking (``bare_row``)
- cost-model candidates (``cand``) and a payload run with the orchestrator's libraries
  blocked (``run_pickled_payload``)
"""
from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import yaml

from hcp_tune.config.cluster import cluster_from_mapping
from hcp_tune.config.model import model_from_mapping
from hcp_tune.store.folder import ResultStore, SweepKey, trial_row
from hcp_tune.store.records import ROW_FILES
from hcp_tune.space.layout import Candidate, Layout, enumerate_layouts, rank_groups
from hcp_tune.spec import Status, TrialResult, TrialSpec, result_from_json

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- trial specs (conftest's fixtures use these)

CONF = REPO / "conf"

def load_model(name: str):
    return model_from_mapping(yaml.safe_load((CONF / "model" / f"{name}.yaml").read_text()), name)

def load_cluster(name: str = "local"):
    return cluster_from_mapping(yaml.safe_load((CONF / "cluster" / f"{name}.yaml").read_text()), name)

def kept_layouts(model: str, *, cp: int, tp: int, seq: int) -> list[Layout]:
    cands = enumerate_layouts(load_model(model), load_cluster(), cp=cp, tp=tp, seq=seq)
    return [c.layout for c in cands if c.kept]

def make_spec(layout: Layout, *, model: str = "tiny", tp: int = 1, seq: int = 128,
              **overrides) -> TrialSpec:
    m = load_model(model)
    fields = dict(
        trial_id=f"{model}-tp{tp}-cp{layout.cp}-{layout.a2a}x{layout.p2p}"
        + (f"-{overrides['inject_fault']}" if overrides.get("inject_fault") else ""),
        a2a=layout.a2a, p2p=layout.p2p, tp=tp, seq=seq,
        heads=m.heads, kv_heads=m.kv_heads, head_dim=m.head_dim, hidden=m.hidden,
        layers=m.layers, vocab=m.vocab,
        warmup_steps=1, measure_steps=2,  # tiny: the behaviour is tested, not the speed
        comm_timeout_s=20.0, time_limit_s=120.0,
        expected_groups=rank_groups(layout, tp=tp, gpus_per_node=8).as_dict(),
    )
    fields.update(overrides)
    return TrialSpec(**fields)

# ---------------------------------------------------------------- job bodies (pickled by value: see conftest)

def double(x: int) -> int:
    return 2 * x

def boom(message: str) -> None:
    raise ValueError(message)

def block_on_fifo(path: str) -> str:
    """Waits for a writer that never comes: the job runs until cancelled or timed out."""
    with open(path) as f:  # opening a FIFO for reading blocks until a writer opens it
        return f.read()

def rank_report() -> dict:
    import submitit

    env = submitit.JobEnvironment()
    return {"global_rank": env.global_rank, "num_tasks": env.num_tasks, "pid": os.getpid()}

# ---------------------------------------------------------------- sweeps through the CLI (real processes)

TINY = ["model=tiny", "cluster=local", "runner=attention", "runner.warmup_steps=1",
        "runner.measure_steps=3"]

ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}

def pinned_repeats(args) -> list[str]:
    """A sweep's trials per layout as these tests were written for: one trial a layout
    unless the test says otherwise (the adaptive default measures each layout at least
    search.min_repeats times, and every layout in contention at least twice: twice the CI cost); a test that sets search.repeats
    gets exactly that many (exhaustive) unless it sets search.adaptive itself. The
    adaptive default is tested with its own arguments (tests/engine/test_sweep_adaptive.py)."""
    args = list(args)
    if not args or args[0] != "sweep":
        return args
    given = {a.split("=", 1)[0] for a in args if "=" in a}
    if "search.adaptive" in given or "search.min_repeats" in given:
        return args
    if "search.repeats" in given:
        return [*args, "search.adaptive=false"]
    return [*args, "search.repeats=1", "search.min_repeats=1"]

def hcp(*args, timeout=600, fault=None):
    """``python -m hcp_tune ARGS`` (``pinned_repeats``); ``fault`` plants a test fault in its
    trials through HCP_TUNE_INJECT_FAULT (``<fault>`` or ``<fault>@<seq>``), never a config key."""
    env = {**ENV, "HCP_TUNE_INJECT_FAULT": fault} if fault else ENV
    return subprocess.run([sys.executable, "-m", "hcp_tune", *pinned_repeats(args)],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)

def start(*args):
    return subprocess.Popen([sys.executable, "-m", "hcp_tune", *pinned_repeats(args)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO, env=ENV, start_new_session=True)

def wait_for(predicate, timeout_s=300, what="condition"):
    """Poll ``predicate`` until it holds (bounded); the sweep runs in another process."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")

def per_layout(got: list[dict]) -> Counter:
    """How many rows each (seq, a2a) has."""
    return Counter((x["seq"], x["a2a"]) for x in got)


def result_file(res: Path, row: dict) -> TrialResult:
    """The result file the orchestrator read for a stored row."""
    return result_from_json((res / "trials" / f"{row['trial_id']}.result.json").read_text())


def rows(results: Path) -> list[dict]:
    """The row files (not a writer's ``.tmp-*``: the store does not read those either)."""
    return [json.loads(p.read_text()) for p in sorted((results / "rows").glob(f"*/{ROW_FILES}"))]

def squeue_ids() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True)
    return set(out.stdout.split())

def kill_after_first_row_and_resume(res: Path, args: list[str]) -> tuple[dict, dict, str]:
    """SIGKILL the sweep once a trial is stored, run it again; (rows before, rows after,
    the second run's stdout), after checking that nothing stored changed."""
    proc = start(*args)
    wait_for(lambda: len(rows(res)) >= 1, what="the first stored trial")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    first = {x["trial_id"]: x for x in rows(res)}
    r = hcp(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    after = {x["trial_id"]: x for x in rows(res)}
    for tid, row in first.items():
        assert after[tid] == row  # nothing measured was lost or re-measured
    return first, after, r.stdout

def journal_text(res: Path) -> str:
    """Every journal of a results folder (one per sweep key under journals/), joined."""
    return "".join(p.read_text() for p in sorted((res / "journals").glob("*.journal")))


def ctrl_c_once_submitted(res: Path, *args) -> tuple[list[dict], set[str]]:
    """Start a sweep that would run for ever, press Ctrl-C once a job is submitted; the rows
    stored and the SLURM jobs that were queued just before the interrupt."""
    proc = start("sweep", *args, *TINY, "runner.measure_steps=100000", "executor=slurm",
                 f"results_dir={res}")
    wait_for(lambda: "job_id" in journal_text(res), what="a submitted job")
    before = squeue_ids()
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    return rows(res), before

# ---------------------------------------------------------------- recorded-style rows (regress, report)

FP = {"torch": "2.13.0", "transformer_engine": "2.9.0", "megatron_core": "0.16.1",
      "hosts": ["node1"], "settings": {}, "inject_delay": None}

CUDA_MEM = "torch.cuda.max_memory_allocated over the measured steps, max over ranks"
CPU_MEM = ("CPU: growth of peak RSS (ru_maxrss) from before warm-up to the last step, max "
           "over ranks; includes allocator caching, 0 if nothing new was touched")

_ids = itertools.count()

def row(tag: str, a2a: int, p2p: int, median: float, *, mem: int = 1 << 30, seq: int = 4096,
        status: str = "ok", fp: dict | None = None, model: str = "tiny",
        mem_note: str = "") -> dict:
    key = SweepKey(cluster="local", model=model, tp=1, cp=a2a * p2p, seq=seq,
                   runner="attention", env_tag=tag)
    spec = TrialSpec(trial_id=f"{key.slug}-t{next(_ids):04d}-a{a2a}", a2a=a2a, p2p=p2p,
                     seq=seq, heads=8, kv_heads=8, head_dim=8)
    ok = status == "ok"
    steps = [median * f for f in (0.98, 1.0, 1.02)] if ok else []
    result = TrialResult(
        trial_id=spec.trial_id, status=Status(status), step_times_s=steps,
        median_s=median if ok else None, p10_s=steps[0] if ok else None,
        p90_s=steps[-1] if ok else None, peak_mem_bytes=mem if ok else None, mem_note=mem_note,
        verification={"groups": {"match": ok}, "numerics": {"passed": ok}},
        fingerprint=dict(FP if fp is None else fp))
    return trial_row(key, spec, result)

def rows_for(tag: str, a2a: int, p2p: int, medians, **kw) -> list[dict]:
    return [row(tag, a2a, p2p, m, **kw) for m in medians]

POOL = REPO / "benchmarks" / "regress_pool_rows.jsonl"

def pool_rows(*tags: str) -> list[dict]:
    """The committed pool (benchmarks/regress_pool.py): one code version measured on the
    shared 2-core CPU in sessions pool-1..4, and delay-1..2 with HCP_TUNE_INJECT_DELAY."""
    got = [json.loads(line) for line in POOL.read_text().splitlines() if line.strip()]
    return [r for r in got if not tags or r["env_tag"] in tags]

def retag(rows: list[dict], tag: str) -> list[dict]:
    return [{**r, "env_tag": tag} for r in rows]

def store(results_dir: Path, rows: list[dict]) -> Path:
    s = ResultStore(results_dir)
    for r in rows:
        key = SweepKey(**{k: r[k] for k in ("cluster", "model", "tp", "cp", "seq", "runner",
                                              "env_tag")})
        s.add(r, key)
    return results_dir

# ---------------------------------------------------------------- bare rows (the store's ranking)

BARE_KEY = dict(cluster="local", model="tiny", tp=1, pp=1, cp=2, seq=256, runner="attention",
           env_tag="default")

def bare_row(a2a, status, median=None, failure_class="", verified=True):
    return {**BARE_KEY, "a2a": a2a, "p2p": 2 // a2a, "comm_type": "a2a" if a2a == 2 else "p2p",
            "status": status, "median_s": median, "p10_s": median, "p90_s": median,
            "failure_class": failure_class, "verified": verified, "peak_mem_bytes": 0,
            "trial_id": f"t-{a2a}-{status}"}

# ---------------------------------------------------------------- cost-model candidates

def cand(a2a, p2p, *, seq, tp=1, gpus_per_node=8):
    layout = Layout(a2a, p2p)
    groups = rank_groups(layout, tp=tp, dp=1, gpus_per_node=gpus_per_node)
    return Candidate(layout, tp, seq, 1, True, groups=groups)

# ---------------------------------------------------------------- a payload run with the orchestrator's libraries blocked

# The libraries are made to look uninstalled: ``sys.modules[name] = None`` makes ``import name``
# raise ImportError and ``importlib.util.find_spec(name)`` return None. (A meta-path finder that
# raises would also break torch._dynamo, which probes optional modules with find_spec at
# import time: a false failure that says nothing about our imports.)
BLOCKED = {"hydra", "omegaconf", "optuna", "pandas", "rich"}

BLOCK = f"""
import sys
BLOCKED = {BLOCKED!r}
for name in BLOCKED:
    sys.modules[name] = None
"""

RUN_PAYLOAD = """
import sys
from submitit.core.utils import DelayedSubmission
result = DelayedSubmission.load(sys.argv[1]).result()
result = result[0] if isinstance(result, list) else result  # a batch payload: its first
loaded = sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED and sys.modules[n] is not None)
assert not loaded, loaded
# nothing of the orchestrator either (hcp_tune.engine.sweep, dispatch, config, store, ...): today
# they import the blocked libraries lazily, tomorrow one may do it at the top
ours = sorted(n for n in sys.modules if n.startswith("hcp_tune."))
strays = [n for n in ours if not n.startswith("hcp_tune.job") and n not in JOB_SIDE]
assert not strays, f"the job imported orchestrator modules: {strays}"
print("payload ran:", result.status.value, result.error or "")
"""

JOB_SIDE = {"hcp_tune.spec", "hcp_tune.flops", "hcp_tune.noise", "hcp_tune.merge",
            "hcp_tune.packing"}  # the contract: standard library only

def run_pickled_payload(tmp_path, fn, *args):
    import os

    from submitit.core.utils import DelayedSubmission

    (tmp_path / "sitecustomize.py").write_text(BLOCK)
    pickled = tmp_path / "payload.pkl"
    DelayedSubmission(fn, *args).dump(pickled)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "SUBMITIT_", "HCP_TUNE_", "TORCHELASTIC"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(REPO)])
    code = (f"BLOCKED = {BLOCKED!r}\nJOB_SIDE = {JOB_SIDE!r}\n" + RUN_PAYLOAD)
    return subprocess.run([sys.executable, "-c", code, str(pickled)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

def payload_spec(a2a: int, p2p: int, trial_id: str):
    from hcp_tune.spec import TrialSpec

    return TrialSpec(trial_id=trial_id, a2a=a2a, p2p=p2p, seq=32, heads=8, kv_heads=8,
                     head_dim=8, warmup_steps=0, measure_steps=1, comm_timeout_s=30.0)
