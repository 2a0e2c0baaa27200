"""Every ``python -m hcp_tune ...`` command of the code blocks of README.md and of the docs
site's pages (``docs/**/*.md``), run as committed.

They are read when the test runs, so neither can drift from the code: a command added
there is either covered by the rules below or fails with "no mapping for README command
...". The commands run in order (README first, then the docs pages by path; a command
that appears twice runs once) in one fresh folder (the working directory, defaults
untouched), as a user following them would type them. How each is run:

- **Pure commands** (``plan``, ``predict``, ``validate``, and ``sweep ... runner=model``)
  run exactly as typed: they never measure, so they are fast on any profile. Expected:
  exit 0 (``validate``: 0, or 1 when it reports errors, its documented findings exit).
- **Measuring commands** (``sweep``, ``trial``, ``recommend``) and other ``hcp_tune.*``
  modules need an entry in ``MAPPINGS``, keyed by the README command (tokens as the
  shell passes them, joined by one space): tokens it replaces (CPU-sized ``seq`` and
  ``cp``, the same in every command, so ``recommend`` finds what ``sweep`` stored), overrides
  it appends (``runner.measure_steps=2`` and so on), and the outcome the README documents.
  GPU-only commands run up to their documented message and exit code on a machine
  without a GPU (a runner=bridge trial fails as an ``environment`` failure and the sweep
  stops with exit 1; ``runner=auto`` predicts and says why when there is no SLURM or
  SLURM's partition cannot hold a trial, as this one-node cluster cannot).
- **Files** the commands name (``run_config.yaml``, ``rows.jsonl``) are written into the
  folder first (``FILES``).
- Not run: the set-up commands around them (venv creation, ``pip``, ``.ci/run``) and the
  benchmark scripts (``python benchmarks/...``), which are not ``hcp_tune`` commands.

SLURM commands use the local cluster (the ``slurm_cluster`` fixture: skipped without
one, failed under ``HCP_TUNE_REQUIRE_SLURM=1`` as in CI).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import pytest

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
PURE = ("plan", "predict", "validate")
SEPARATORS = ("&&", "||", ";", "|")
# CPU-sized measured examples, the same in every command (so `recommend` finds what `sweep`
# stored): shorter sequences, and cp=2, since every rank of every trial is a process that
# imports torch and Megatron-Core (cp=4 in all three would start 34 of them instead of 14)
SMALL = {"seq=2048": "seq=256", "seq=[2048,4096]": "seq=[256,512]", "cp=4": "cp=2"}
FAST = ("runner.warmup_steps=1", "runner.measure_steps=2")
# docs/quickstart.md's two tagged sweeps on one seq: regress needs their 3 trials a layout,
# and each repeat round is a job of its own (start-up is most of a CPU trial's time)
QUICK = {**SMALL, "seq=[2048,4096]": "seq=256"}
# runner=bridge examples on the local profile (what they reach here: Bridge is absent)
BRIDGE_LOCAL = {"cluster=dgx-h100": "cluster=local", "model=llama3-8b": "model=tiny",
                "cp=8": "cp=2", "seq=65536": "seq=256", "executor=slurm": "executor=local"}

FILES = {
    # a Bridge run config with a correct HCP setting (validate's file example)
    "run_config.yaml": (
        "model:\n  tensor_model_parallel_size: 1\n  context_parallel_size: 8\n"
        "  cp_comm_type: a2a+p2p\n  hierarchical_context_parallel_sizes: [2, 4]\n"
        "  seq_length: 131072\ndist:\n  use_decentralized_pg: false\n"),
    # measured CPU rows, the calibration example's input
    "rows.jsonl": (REPO / "benchmarks" / "calibrate_cpu_rows.jsonl").read_text(),
    # the truth files the docs write with a heredoc before their runner=synthetic sweeps
    **{name: body + "\n" for page in (REPO / "docs").rglob("*.md")
       for name, body in re.findall(r"cat > (\S+) <<'EOF'\n(.*?)\nEOF", page.read_text(), re.S)},
}


# ------------------------------------------------------------------------- extraction
def readme_commands(text: str) -> list[tuple[str, ...]]:
    """Each ``python -m hcp_tune[.module] ARGS`` (or ``hcp-tune ARGS``) of the fenced code
    blocks, as ``(module, *args)`` the way the shell passes them: continuation lines
    joined, quotes removed, comments dropped, ``&&``-chained set-up commands split off.
    A block fenced as ```` ```text ```` is output and is skipped."""
    out = []
    for lang, block in re.findall(r"^```([^\n]*)\n(.*?)^```", text, flags=re.S | re.M):
        if lang.strip() == "text":  # a command's output shown as it prints, not a command
            continue
        for line in re.sub(r"\\\n", " ", block).splitlines():
            segment: list[str] = []
            for token in [*shlex.split(line, comments=True), "&&"]:
                if token not in SEPARATORS:
                    segment.append(token)
                    continue
                command = _hcp_command(segment)
                if command:
                    out.append(command)
                segment = []
    return out


def _hcp_command(tokens: list[str]) -> Optional[tuple[str, ...]]:
    for i, token in enumerate(tokens):
        if re.fullmatch(r"(\S*/)?hcp-tune", token):
            return ("hcp_tune", *tokens[i + 1:])
        module = tokens[i + 2] if i + 2 < len(tokens) else ""
        if (re.fullmatch(r"(\S*/)?python3?", token) and tokens[i + 1:i + 2] == ["-m"]
                and re.fullmatch(r"hcp_tune(\.\w+)*", module)):
            return tuple(tokens[i + 2:])
    return None


def documented_commands() -> list[tuple[str, ...]]:
    """README.md's commands, then each docs page's, each distinct command once."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    commands = [c for page in pages for c in readme_commands(page.read_text())]
    return list(dict.fromkeys(commands))


def text_of(command: tuple[str, ...]) -> str:
    return "python -m " + " ".join(command)


# ------------------------------------------------------------------------- expectations
Check = Callable[[subprocess.CompletedProcess, Path], None]


def exit_code(*codes: int) -> Check:
    def check(r, cwd):
        assert r.returncode in codes, f"exit {r.returncode}, expected {codes}"
    return check


def measured_sweep(r, cwd):
    assert r.returncode == 0, f"exit {r.returncode}"
    assert "ranked:" in r.stdout
    recs = (cwd / "results" / "recommendations.csv").read_text().splitlines()
    assert len(recs) == 1 + 2, recs  # header + seq 256 and 512


def tagged_sweep(tag: str) -> Check:
    """docs/quickstart.md's sweeps, shrunk (``QUICK``): one seq measured under ``tag``."""
    def check(r, cwd):
        assert r.returncode == 0, f"exit {r.returncode}"
        assert "ranked:" in r.stdout
        recs = (cwd / "results" / "recommendations.csv").read_text().splitlines()
        assert sum(f",{tag}," in line for line in recs) == 1, recs
    return check


def cluster_listing(r, cwd):
    """`recommend cluster=local model=tiny`: every measured key of the cluster, a line each."""
    assert r.returncode == 0, f"exit {r.returncode}"
    keys = [ln for ln in r.stdout.splitlines() if ln.startswith("tiny ")]
    assert len(keys) >= 2 and any(" 256 " in k for k in keys) and any(" 512 " in k for k in keys)


def regressed_tags(r, cwd):
    """quickstart's regress of two tags measured by the same code: a table, and one of the
    documented exits (0 nothing flagged, 1 a flag, 4 inconclusive)."""
    assert r.returncode in (0, 1, 4), f"exit {r.returncode}"
    assert "before" in r.stdout and "after" in r.stdout


def found_recommendation(r, cwd):
    assert r.returncode == 0, f"exit {r.returncode}"
    assert "Bridge overrides:" in r.stdout and "model.context_parallel_size=2" in r.stdout


def ok_trial(r, cwd):
    assert r.returncode == 0, f"exit {r.returncode}"
    result = json.loads(r.stdout)
    assert result["status"] == "ok" and result["verification"]["numerics"]["passed"], result


def gpu_profile_sweep(r, cwd):
    """README set-up: `sweep cp=8 seq=131072` (dgx-h100, runner=auto) on this machine."""
    if shutil.which("sbatch"):  # "measures when the partition has the nodes and GPUs a
        # trial needs, and otherwise says so and predicts": this one-node cluster cannot
        # hold the recipe's 32-rank stage (4 nodes), so nothing is submitted
        assert r.returncode == 0, f"exit {r.returncode}"
        assert "needs 32 ranks on 4 node(s) of 8 GPUs: predicting" in r.stderr, r.stderr
        assert "PREDICTED" in r.stdout
    else:  # "says so in one line and prints the cost model's predicted ranking"
        assert r.returncode == 0, f"exit {r.returncode}"
        assert "runner=auto: no GPU and no SLURM here: predicting" in r.stderr
        assert "PREDICTED" in r.stdout


def bridge_absent(r, cwd):
    """runner=bridge on a machine without Bridge and TE: the documented environment stop."""
    assert r.returncode == 1, f"exit {r.returncode}"
    assert "stopped submitting after an environment failure" in r.stderr
    assert "Megatron-Bridge (megatron.bridge) not importable" in r.stderr, r.stderr


def regress_without_those_tags(r, cwd):
    """README: `regress baseline=te-2.9 candidate=te-2.10` in a folder where only the
    README's CPU sweep (env_tag=default) was measured: the documented bad-input exit."""
    assert r.returncode == 2, f"exit {r.returncode}"
    # the quickstart's tags (before, after) may be stored by then too
    assert re.search(r"unknown env tag\(s\) te-2\.9, te-2\.10; tags with stored trials: "
                     r"(\w+, )*default\b", r.stderr), r.stderr


def regress_without_tags_a_b(r, cwd):
    """docs/regress.md's settle example (`baseline=a candidate=b`) in the same folder: the
    same documented bad-input exit, before any sweep runs."""
    assert r.returncode == 2, f"exit {r.returncode}"
    assert re.search(r"unknown env tag\(s\) a, b; tags with stored trials: (\w+, )*default\b",
                     r.stderr), r.stderr


def power_plan(r, cwd):
    assert r.returncode == 0, f"exit {r.returncode}"
    assert "trials per tag give" in r.stdout and "search.purpose=regress" in r.stdout


def report_page(r, cwd):
    assert r.returncode == 0, f"exit {r.returncode}"
    assert "<svg" in (cwd / "results" / "report.html").read_text()


def calibrated(r, cwd):
    assert r.returncode == 0, f"exit {r.returncode}"
    assert list((cwd / "results" / "calibration").glob("*.json"))


def packed_sweep(r, cwd):
    """docs/guides/packed.md's sweep, CPU-sized (``PACKED``): every layout measured and
    ranked under the web mix's key, in a folder of its own."""
    assert r.returncode == 0, f"exit {r.returncode}"
    assert "ranked:" in r.stdout
    recs = (cwd / "packed" / "recommendations.csv").read_text()
    assert "web#" in recs, recs


def packed_recommendation(r, cwd):
    assert r.returncode == 0, f"exit {r.returncode}"
    assert "web#" in r.stdout and "hierarchical_context_parallel_sizes" in r.stdout, r.stdout


# docs/guides/packed.md's measured commands on CPU: seq 1024 (a few web documents a
# sequence), cp=2, their results in a folder of their own
PACKED = {"seq=8192": "seq=1024", "cp=4": "cp=2"}


@dataclass(frozen=True)
class Mapping:
    expect: Check
    replace: dict[str, str] = field(default_factory=dict)  # README token -> token run
    extra: tuple[str, ...] = ()  # overrides appended
    needs_gpu_absent: bool = False  # the README documents its behaviour without a GPU
    skip: str = ""  # why it cannot run here at all


MAPPINGS = {
    "python -m hcp_tune sweep cp=8 seq=131072": Mapping(
        # GPU profile, Bridge's 128K recipe (tp=4 pp=2): predicted here (see above)
        gpu_profile_sweep, needs_gpu_absent=True, extra=("executor.array_parallelism=1",)),
    "python -m hcp_tune sweep cp=4 seq=[2048,4096] model=tiny cluster=local runner=attention "
    "executor=slurm": Mapping(measured_sweep, SMALL, (*FAST, "search.early_stop=false")),
    "python -m hcp_tune recommend cluster=local model=tiny cp=4 seq=2048": Mapping(
        found_recommendation, SMALL),
    "python -m hcp_tune trial cp=4 seq=2048 model=tiny cluster=local a2a=2": Mapping(
        ok_trial, SMALL, FAST),
    "python -m hcp_tune.calibrate rows.jsonl results_dir=results": Mapping(calibrated),
    # docs/quickstart.md: two tags of the local sweep, the cluster's table, a regress
    **{"python -m hcp_tune sweep cp=4 seq=[2048,4096] model=tiny cluster=local "
       f"runner=attention executor=local search.repeats=3 search.purpose=regress env_tag={tag}":
           Mapping(tagged_sweep(tag), QUICK, FAST)
       for tag in ("before", "after")},
    "python -m hcp_tune recommend cluster=local model=tiny": Mapping(cluster_listing),
    "python -m hcp_tune recommend cluster=local model=tiny cp=4 seq=2048 env_tag=before": Mapping(
        found_recommendation, SMALL),
    "python -m hcp_tune regress baseline=before candidate=after": Mapping(regressed_tags),
    "python -m hcp_tune regress baseline=te-2.9 candidate=te-2.10": Mapping(
        regress_without_those_tags),
    # settle=true reads the same rows first: the same documented bad-input exit
    "python -m hcp_tune regress baseline=te-2.9 candidate=te-2.10 settle=true "
    "candidate_args=executor.container_image=/images/bridge-te2.10.sqsh": Mapping(
        regress_without_those_tags),
    "python -m hcp_tune regress baseline=te-2.9 candidate=te-2.10 settle=true "
    "candidate_args=executor.container_image=/images/bridge-te2.10.sqsh "
    "baseline_args=executor.container_image=/images/bridge-te2.9.sqsh": Mapping(
        regress_without_those_tags),
    "python -m hcp_tune regress baseline=a candidate=b settle=true "
    "candidate_args=executor=local": Mapping(regress_without_tags_a_b),
    "python -m hcp_tune report": Mapping(report_page),
    # docs/regress.md: the plan needs no stored trial when noise= is given
    "python -m hcp_tune regress power effect=0.07 noise=0.02": Mapping(power_plan),
    "python -m hcp_tune regress run baseline=te-2.9 candidate=te-2.10 trials=5 "
    "baseline_args=model=llama3-8b cp=4 executor=local "
    "executor.container_image=/images/te-2.9.sqsh candidate_args=model=llama3-8b cp=4 "
    "executor=local executor.container_image=/images/te-2.10.sqsh": Mapping(
        exit_code(0, 1, 4), skip="needs the two TE containers and a GPU allocation"),
    # runner=bridge without Bridge and TE: the job's first check stops the sweep (exit 1)
    "python -m hcp_tune sweep runner=bridge cluster=dgx-h100 model=llama3-8b cp=8 seq=65536 "
    "executor=slurm": Mapping(bridge_absent, BRIDGE_LOCAL),
    "python -m hcp_tune sweep runner=bridge runner.recipe=llama3_8b_pretrain_config cp=8 "
    "seq=65536 runner.overrides=[\"model.recompute_granularity=full\","
    "\"model.recompute_method=uniform\",\"model.recompute_num_layers=1\"]": Mapping(
        bridge_absent, BRIDGE_LOCAL, ("cluster=local", "model=tiny", "executor=local")),
    "python -m hcp_tune sweep runner=attention+bridge runner.top_k=2 cluster=dgx-h100 "
    "model=llama3-8b cp=8 seq=65536": Mapping(
        bridge_absent, BRIDGE_LOCAL, (*FAST, "executor=local")),
    "python -m hcp_tune sweep cp=4 seq=8192 data.packing=thd data.lengths=web model=tiny "
    "cluster=local runner=attention": Mapping(
        packed_sweep, PACKED, (*FAST, "executor=local", "results_dir=packed")),
    "python -m hcp_tune recommend cluster=local model=tiny cp=4 seq=8192 data.packing=thd "
    "data.lengths=web": Mapping(packed_recommendation, PACKED, ("results_dir=packed",)),
    # runner=synthetic draws its trials here: run as typed, into folders of their own (its
    # keys would otherwise join the local cluster's listing the quickstart checks)
    "python -m hcp_tune sweep cp=8 seq=1024 tp=1 pp=1 model=tiny cluster=local "
    "runner=synthetic runner.truth=truth.json search.order_by_prediction=false "
    "results_dir=results": Mapping(exit_code(0), {"results_dir=results": "results_dir=syn-a"}),
    "python -m hcp_tune sweep cp=8 seq=131072 tp=1 pp=1 runner=synthetic runner.truth=truth.yaml "
    "runner.seed=1": Mapping(exit_code(0), extra=("results_dir=syn-b",)),
    "python -m hcp_tune sweep runner=bridge cluster=dgx-h100 model=llama3-8b cp=8 seq=65536 "
    "executor=slurm executor.partition=batch executor.time_limit_min=60 executor.exclusive=true "
    "executor.container_image=nvcr.io/nvidia/nemo:26.08.01 executor.container_mounts=["
    "/lustre/me/hcp-job:/lustre/me/hcp-job,/lustre/me/results:/lustre/me/results] "
    "executor.setup=[\"export PYTHONPATH=/lustre/me/hcp-job:$PYTHONPATH\"] "
    "executor.python=python results_dir=/lustre/me/results": Mapping(
        bridge_absent, skip="needs a SLURM cluster with pyxis, the Bridge container and /lustre"),
}


@dataclass(frozen=True)
class Planned:
    args: tuple[str, ...]  # after ``python -m``
    expect: Check
    skip: str = ""  # why it is not run here


def plan_for(command: tuple[str, ...]) -> Planned:
    """What runs for one README command, or LookupError when nothing covers it."""
    text = text_of(command)
    mapping = MAPPINGS.get(text)
    if mapping is not None:
        if mapping.skip:
            return Planned(command, mapping.expect, skip=mapping.skip)
        if mapping.needs_gpu_absent and shutil.which("nvidia-smi"):
            return Planned(command, mapping.expect, skip="it would measure on this GPU")
        args = tuple(mapping.replace.get(a, a) for a in command) + mapping.extra
        return Planned(args, mapping.expect)
    module, sub = command[0], command[1] if len(command) > 1 else ""
    if module == "hcp_tune" and (sub in PURE or (sub == "sweep" and "runner=model" in command)):
        return Planned(command, exit_code(0, 1) if sub == "validate" else exit_code(0))
    raise LookupError(f"no mapping for README command {text!r}: add it to MAPPINGS in "
                      "tests/test_readme_commands.py (what runs instead and what to expect)")


# ------------------------------------------------------------------------- tests
def test_extraction_joins_lines_drops_quotes_comments_and_set_up():
    text = (
        "intro `python -m hcp_tune plan` in prose is not a code block\n"
        "```bash\n"
        "# a comment\n"
        "python3 -m venv .venv && .venv/bin/python -m hcp_tune sweep cp=8 seq=131072\n"
        "python -m hcp_tune validate a=1 \\\n    \"b=[2,4]\" c=3\n"
        "python -m hcp_tune.calibrate rows.jsonl   # trailing comment\n"
        "python benchmarks/calibrate_cpu.py\n"
        "hcp-tune plan cp=2\n"
        "```\n")
    assert readme_commands(text) == [
        ("hcp_tune", "sweep", "cp=8", "seq=131072"),
        ("hcp_tune", "validate", "a=1", "b=[2,4]", "c=3"),
        ("hcp_tune.calibrate", "rows.jsonl"),
        ("hcp_tune", "plan", "cp=2"),
    ]


def test_a_command_nobody_mapped_is_named():
    with pytest.raises(LookupError, match=re.escape(
            "no mapping for README command 'python -m hcp_tune trial cp=64 a2a=8'")):
        plan_for(("hcp_tune", "trial", "cp=64", "a2a=8"))
    assert plan_for(("hcp_tune", "plan", "cp=2")).args == ("hcp_tune", "plan", "cp=2")


def test_readme_is_short_and_docs_stay_inside_the_repository():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for page in [REPO / "README.md", *(REPO / "docs").rglob("*.md")]:
        text = page.read_text()
        assert "../shared" not in text and "/work/" not in text, page
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            assert (page.parent / target).resolve().is_relative_to(REPO), (page, target)
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme):  # no site here
        assert (REPO / target).exists(), f"README links to {target}, which is not a file"


def test_docs_commands_are_collected_once_each():
    commands = documented_commands()
    assert len(commands) == len(set(commands))
    assert ("hcp_tune.calibrate", "rows.jsonl", "results_dir=results") in commands


@pytest.mark.readme
def test_every_readme_command_runs_as_documented(slurm_cluster, tmp_path):
    commands = documented_commands()
    assert len(commands) >= 5, commands  # the README has its examples
    for name, content in FILES.items():
        (tmp_path / name).write_text(content)
    problems, ran = [], []
    for command in commands:
        try:
            planned = plan_for(command)
        except LookupError as exc:
            problems.append(str(exc))
            continue
        if planned.skip:
            ran.append(f"not run ({planned.skip}): {text_of(command)}")
            continue
        start = time.monotonic()
        r = subprocess.run([sys.executable, "-m", *planned.args], capture_output=True,
                           text=True, cwd=tmp_path, env=ENV, timeout=600)
        ran.append(f"exit {r.returncode} in {time.monotonic() - start:.0f} s: "
                   f"{text_of(planned.args)}")
        try:
            assert "Traceback" not in r.stderr, "a traceback"
            planned.expect(r, tmp_path)
        except (AssertionError, OSError, ValueError) as exc:
            tail = "\n    ".join((r.stdout + r.stderr).strip().splitlines()[-8:])
            problems.append(f"{text_of(command)} (ran: {text_of(planned.args)}): {exc}\n    {tail}")
    print("\n".join(ran))
    assert not problems, "\n".join(problems)
