"""The CLI as a user meets it: subprocesses, exit codes, one-line errors, no torch."""
import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def run(*args, env=None, cwd=REPO):
    return subprocess.run(
        [sys.executable, "-m", "hcp_tune", *args], capture_output=True, text=True,
        cwd=cwd, env={**os.environ, **(env or {})}, timeout=120,
    )


def test_plan_lists_every_cp8_layout_kept_with_groups():
    r = run("plan", "cp=8", "seq=131072", "tp=1", "pp=1", "model=llama3-8b", "cluster=dgx-h100",
            "format=json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    rows = plan["candidates"]
    assert [(c["sizes"], c["comm_type"], c["kept"]) for c in rows] == [
        ([1, 8], "p2p", True), ([2, 4], "a2a+p2p", True),
        ([4, 2], "a2a+p2p", True), ([8, 1], "a2a", True),
    ]
    assert rows[1]["groups"]["a2a"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert rows[1]["groups"]["p2p"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert rows[1]["bridge_overrides"][-1] == '"model.hierarchical_context_parallel_sizes=[2,4]"'


def test_plan_cp16_tp2_rejects_and_flags_with_reasons():
    r = run("plan", "cp=16", "tp=2", "pp=1", "seq=131072", "model=llama3-8b",
            "cluster=dgx-h100", "format=json")
    assert r.returncode == 0, r.stderr
    rows = {tuple(c["sizes"]): c for c in json.loads(r.stdout)["candidates"]}
    assert rows[(4, 4)]["kept"] and rows[(4, 4)]["crosses_nodes"] == "p2p"
    assert not rows[(8, 2)]["kept"]
    assert "KV heads/tp = 8/2 = 4" in rows[(8, 2)]["reasons"][0]
    assert rows[(8, 2)]["findings"][0]["rule"] == "heads-a2a"
    assert "crosses nodes" in rows[(8, 2)]["flags"][0]
    assert not rows[(16, 1)]["kept"]
    assert rows[(1, 16)]["nodes"] == 4


def test_plan_table_is_readable_when_piped():
    r = run("plan", "cp=4", "seq=8192", "model=tiny", "cluster=local")
    assert r.returncode == 0
    assert "[a2a,p2p]" in r.stdout and "[2,2]" in r.stdout and "crosses" in r.stdout


@pytest.mark.parametrize("args", [
    ("plan", "cp=8", "tp=4", "pp=2", "seq=131072", "cluster=dgx-h100"),
    ("predict", "cp=8", "seq=131072", "model=llama3-70b", "cluster=dgx-h200"),
    ("predict", "cp=8", "seq=131072", "cluster=dgx-h100"),
    ("validate", "model.context_parallel_size=8", "model.cp_comm_type=a2a+p2p",
     "cluster=dgx-h100"),
    ("recommend", "cluster=local", "model=tiny", "cp=4", "seq=2048"),
], ids=["plan", "predict-unfit", "predict", "validate", "recommend-predicted"])
def test_piped_output_fits_100_columns_and_breaks_between_words(args, tmp_path):
    """Piped (no terminal, no $COLUMNS), every line fits 100 columns except a command
    printed for copying, which is never broken; wrapped prose breaks between words, so an
    override such as "model.hierarchical_context_parallel_sizes=[2,4]" stays whole."""
    folder = [] if args[0] == "validate" else [f"results_dir={tmp_path}"]
    r = run(*args, *folder, env={"COLUMNS": ""})
    assert r.returncode in (0, 1, 3), r.stderr
    long = [line for line in r.stdout.splitlines()
            if len(line) > 100 and not line.startswith("  python -m hcp_tune ")]
    assert not long
    for override in re.findall(r'"model\.[a-z_.]+=\[[0-9,]*', r.stdout):
        assert re.search(re.escape(override) + r'\]"', r.stdout), override  # not folded


def test_validate_prints_the_fix_whole_on_its_own_line():
    r = run("validate", "model.context_parallel_size=8", "model.cp_comm_type=a2a+p2p",
            "cluster=dgx-h100", env={"COLUMNS": "60"})
    assert r.returncode == 1
    assert '  fix:   "model.hierarchical_context_parallel_sizes=[4,2]"' in r.stdout.splitlines()
    found = [line for line in r.stdout.splitlines() if line.startswith(("  found: ", "         "))]
    assert len(found) > 3 and all(len(line) <= 60 for line in found)  # $COLUMNS is honoured


def test_plan_table_fits_100_columns_and_groups_say_what_was_left_out():
    r = run("plan", "cp=8", "tp=4", "pp=2", "seq=131072", "cluster=dgx-h100")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["tp", "seq"])
    end = next(i for i, line in enumerate(lines) if line.startswith("groups "))
    assert end - start > 4 and all(len(line) <= 100 for line in lines[start:end])
    assert "[heads-a2a] a2a size 4 does not divide" in r.stdout  # the reason, at word breaks
    groups = [line for line in lines if line.startswith("groups tp=4 seq=131072 [2,4]: ")]
    assert groups and "+28 more" in groups[0]  # 32 a2a groups over 64 ranks, 4 shown
    assert "format=json lists every group" in r.stdout


def test_plan_preset_from_sweeps_and_override_wins():
    r = run("plan", "sweeps=cpu-smoke", "cp=2", "format=json")
    plan = json.loads(r.stdout)
    assert plan["model"] == "tiny" and plan["cluster"] == "local" and plan["cp"] == 2
    assert sorted({c["seq"] for c in plan["candidates"]}) == [2048, 4096]


@pytest.mark.parametrize(
    "args,message",
    [
        (["cluster=nope"], "cluster=nope: unknown cluster option; expected one of: dgx-a100"),
        (["model=nope"], "model=nope: unknown model option; expected one of:"),
        (["sweeps=nope"], "sweeps=nope: unknown sweeps option; expected one of: cpu-smoke"),
        (["cp=0"], "cp=0: expected an integer in 1..1024"),
        (["cp=-8"], "cp=-8: expected an integer in 1..1024"),
        (["cp=abc"], "cp='abc': expected an integer in 1..1024"),
        (["seq=12.5"], "seq=12.5: expected an integer in 1..16777216"),
        (["seq=[1024,x]"], "element 'x' is not an integer"),
        (["tp=3"], "tp=3: [heads-tp] tp=3 does not divide the heads (32) and KV heads (8)"),
        (["cp=["], "malformed override 'cp=['"),
        (["cp"], "malformed override 'cp': expected KEY=VALUE"),
        (["foo=1"], "foo: unknown key; expected one of: cp, seq, tp"),
        (["dtype=fp8"], "dtype='fp8': expected one of bf16, fp16, fp32"),
        (["env_tag=a/b"], "env_tag='a/b': expected a name of letters, digits, '.', '_' and '-'"),
        (["env_tag=../../x"], "env_tag='../../x': expected a name of letters, digits"),
        (["env_tag=.."], "env_tag='..': expected a name of letters, digits"),
    ],
)
def test_plan_bad_input_is_one_line_exit_2(args, message):
    r = run("plan", *args)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert all(line.startswith("hcp-tune: error: ") for line in r.stderr.splitlines())


def test_an_env_tag_name_with_dots_and_dashes_is_accepted():
    r = run("plan", "cp=2", "seq=4096", "env_tag=te-2.10_rc1", "format=json")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("results_dir,why", [
    ("/proc/hcp-tune-nope", "No such file or directory"),  # /proc takes no new folders
    ("{tmp}/a-file/results", "Not a directory"),
])
@pytest.mark.parametrize("command", [["sweep", "runner=attention"], ["trial", "a2a=1"]])
def test_an_unwritable_results_dir_is_one_line_before_anything_runs(
        tmp_path, command, results_dir, why):
    (tmp_path / "a-file").write_text("")
    results_dir = results_dir.format(tmp=tmp_path)
    r = run(*command, "cluster=local", "model=tiny", "cp=2", "seq=256", "executor=local",
            f"results_dir={results_dir}", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == (f"hcp-tune: error: results_dir='{results_dir}': cannot write there "
                        f"({why}); expected a folder this user can create and write, e.g. "
                        "results_dir=results\n")
    assert r.stdout == "" and not (tmp_path / "results").exists()


def test_an_empty_environment_variable_counts_as_unset():
    r = run("plan", "cp=2", "seq=4096", env={"HCP_TUNE_CONF_DIR": "", "HCP_TUNE_CONFIG_PATH": ""})
    assert r.returncode == 0, r.stderr


def test_a_bad_conf_dir_blames_the_environment_not_the_overrides(tmp_path):
    r = run("plan", "cp=8", "seq=131072", env={"HCP_TUNE_CONF_DIR": "nowhere"}, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == (f"hcp-tune: error: HCP_TUNE_CONF_DIR='nowhere': no config.yaml in "
                        f"{tmp_path / 'nowhere'}; expected a folder laid out like hcp-tune's "
                        "conf/ (or unset it)\n")
    assert "override" not in r.stderr


def test_several_problems_are_reported_together():
    r = run("plan", "cp=0", "seq=abc")
    assert r.returncode == 2
    assert "cp=0" in r.stderr and "seq='abc'" in r.stderr


def test_malformed_cluster_profile_names_the_key(tmp_path):
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "mine.yaml").write_text(
        "device: cuda\ngpu_name: x\ngpus_per_nodes: 8\nintra_node_bw_gbs: 1\n"
        "inter_node_bw_gbs: 1\npeak_bf16_tflops: 1\ngpu_memory_gib: 1\n"
    )
    r = run("plan", "cluster=mine", env={"HCP_TUNE_CONFIG_PATH": str(tmp_path)})
    assert r.returncode == 2
    assert "cluster.gpus_per_nodes: unknown key; valid keys are: name, device" in r.stderr
    assert r.stderr.rstrip().endswith(f"(in {tmp_path}/cluster/mine.yaml:3)")  # path and line
    (tmp_path / "cluster" / "mine.yaml").write_text(
        "device: cuda\ngpu_name: x\ngpus_per_node: many\nintra_node_bw_gbs: 1\n"
        "inter_node_bw_gbs: 1\npeak_bf16_tflops: 1\ngpu_memory_gib: 1\n"
    )
    r = run("plan", "cluster=mine", env={"HCP_TUNE_CONFIG_PATH": str(tmp_path)})
    where = f"(in {tmp_path}/cluster/mine.yaml:3)"
    assert f"cluster.gpus_per_node='many': expected an integer >= 1 {where}" in r.stderr


def test_user_cluster_profile_is_one_yaml_file(tmp_path):
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "mine.yaml").write_text(
        "device: cuda\ngpu_name: L40S\ngpus_per_node: 4\nintra_node_bw_gbs: 32\n"
        "inter_node_bw_gbs: 25\npeak_bf16_tflops: 362\ngpu_memory_gib: 48\n"
    )
    r = run("plan", "cluster=mine", "cp=8", "seq=65536", "tp=1", "format=json",
            env={"HCP_TUNE_CONFIG_PATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    rows = {tuple(c["sizes"]): c for c in json.loads(r.stdout)["candidates"]}
    assert rows[(8, 1)]["flags"] and not rows[(4, 2)]["flags"]


def test_unknown_command():
    r = run("tune")
    assert r.returncode == 2 and "unknown command 'tune'" in r.stderr


def test_validate_exit_codes_and_fix(tmp_path):
    good = ["model.context_parallel_size=8", "model.cp_comm_type=a2a+p2p",
            "model.hierarchical_context_parallel_sizes=[2,4]", "model.seq_length=131072",
            "te_version=2.9.0", "model=llama3-8b"]
    r = run("validate", *good)
    assert r.returncode == 0, r.stderr
    cfg = tmp_path / "run_config.yaml"
    cfg.write_text("model:\n  context_parallel_size: 8\n  cp_comm_type: a2a+p2p\n"
                   "  seq_length: 131072\n")
    r = run("validate", str(cfg), "model=llama3-8b", "cluster=dgx-h100", "format=json",
            "te_version=2.9.0")
    assert r.returncode == 1
    (f,) = json.loads(r.stdout)["findings"]
    assert f["rule"] == "silent-cp-off"
    assert f["fix"] == '"model.hierarchical_context_parallel_sizes=[4,2]"'


def test_validate_reads_run_recipe_dry_run_output():
    dry = str(REPO / "tests" / "data" / "bridge_dry_run.yaml")
    r = run("validate", dry, "te_version=2.17.1", "cluster=dgx-h100")
    assert r.returncode == 0, r.stdout + r.stderr
    r = run("validate", dry, "model.calculate_per_token_loss=false", "te_version=2.17.1",
            "format=json")
    assert r.returncode == 1
    (f,) = json.loads(r.stdout)["findings"]
    assert (f["rule"], f["severity"]) == ("finetune-cp-loss", "error")
    assert f["fix"] == "model.calculate_per_token_loss=true ddp.average_in_collective=false"


@pytest.mark.parametrize("plan_args,bridge,rule", [
    (["cp=8", "seq=131000"], ["model.context_parallel_size=8", "model.seq_length=131000",
                              "model.cp_comm_type=p2p"], "seq-divisible"),
    (["cp=16", "tp=2", "seq=131072"],
     ["model.context_parallel_size=16", "model.tensor_model_parallel_size=2",
      "model.cp_comm_type=a2a+p2p", "model.hierarchical_context_parallel_sizes=[8,2]",
      "model.seq_length=131072"], "heads-a2a"),
])
def test_plan_and_validate_report_the_same_rule_and_fix(plan_args, bridge, rule):
    common = ["model=llama3-8b", "cluster=dgx-h100", "format=json"]
    plan = run("plan", *plan_args, *common)
    assert plan.returncode == 0, plan.stderr
    rejected = [f for c in json.loads(plan.stdout)["candidates"] for f in c["findings"]
                if f["rule"] == rule]
    val = run("validate", *bridge, *common, "te_version=2.17.1")
    assert val.returncode == 1, val.stderr
    (found,) = [f for f in json.loads(val.stdout)["findings"] if f["rule"] == rule]
    assert rejected and found in rejected  # same id, same text, same fix


@pytest.mark.parametrize(
    "args,message",
    [
        (["missing.yaml"], "config=missing.yaml: no such file"),
        ([], "validate needs a Bridge config YAML"),
        (["cp=8"], "cp=8: validate takes a config file, Bridge overrides"),
        (["model.context_parallel_size=x"], "model.context_parallel_size='x': expected an integer"),
        (["model.context_parallel_size=8", "cluster=nope"], "cluster=nope: unknown cluster option"),
    ],
)
def test_validate_bad_input_exit_2(args, message):
    r = run("validate", *args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_validate_yaml_that_is_not_a_mapping(tmp_path):
    (tmp_path / "x.yaml").write_text("just a string\n")
    r = run("validate", str(tmp_path / "x.yaml"))
    assert r.returncode == 2
    assert "expected a mapping with sections such as model: and dist:, got str" in r.stderr


@pytest.mark.parametrize("command", [
    ["plan", "cp=8", "seq=131072"],
    ["validate", "model.context_parallel_size=8", "model.cp_comm_type=p2p"],
])
def test_orchestrator_commands_do_not_import_torch(command):
    code = (
        "import sys; from hcp_tune.cli import main; rc = main(%r); "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert 'megatron' not in sys.modules; "
        "assert 'scipy' not in sys.modules, 'scipy imported'; sys.exit(rc)" % (command,)
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr


def test_a_piped_sweeps_trial_lines_wrap_at_the_width(monkeypatch, capsys):
    """A trial's progress line (a failure's detail names its log) wraps between words at
    $COLUMNS; the log's path, one word, stays whole."""
    from types import SimpleNamespace

    from hcp_tune.outputs.ui import SweepReporter

    monkeypatch.setenv("COLUMNS", "60")
    spec = SimpleNamespace(a2a=2, p2p=1, tp=1, seq=1024, trial_id="f4050ba726ad-t000-a2")
    log = "/results/jobs/29894/29894_0_log.err"
    SweepReporter(live=False).trial(spec, "failed", f"nccl_timeout: the collective hung; see {log}")
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 1 and all(len(line) <= 60 for line in lines)
    assert any(line.strip() == log or line.endswith(log) for line in lines)
