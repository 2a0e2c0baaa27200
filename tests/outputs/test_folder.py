"""``results``: what a results folder holds, per env tag, without reading the journal."""
import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import rows_for, store  # noqa: E402

from hcp_tune.outputs import folder  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def hcp(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "hcp_tune", *args], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=300)


def test_each_tag_counts_its_keys_trials_and_bytes(tmp_path):
    rows = (rows_for("te-2.9", 1, 2, [1.0, 1.1, 1.2]) + rows_for("te-2.9", 2, 1, [1.0])
            + rows_for("te-2.9", 1, 2, [1.0], seq=8192)
            + rows_for("te-2.10", 1, 2, [1.0, 1.0], model="tiny-gqa"))
    root = store(tmp_path / "res", rows)
    (root / "optuna.journal").write_text("x" * 1000)
    doc = folder.summarize(root)
    tags = {t["env_tag"]: t for t in doc["tags"]}
    assert [t["env_tag"] for t in doc["tags"]] == ["te-2.10", "te-2.9"]
    # cp=2 [1,2] and [2,1] share a key; seq 8192 is another
    assert (tags["te-2.9"]["keys"], tags["te-2.9"]["trials"]) == (2, 5)
    assert (tags["te-2.10"]["keys"], tags["te-2.10"]["trials"]) == (1, 2)
    assert tags["te-2.10"]["models"] == ["tiny-gqa"]
    row_files = list((root / "rows").glob("*/*.json"))
    assert sum(t["bytes"] for t in doc["tags"]) == sum(p.stat().st_size for p in row_files)
    assert doc["journal_bytes"] == 1000
    assert doc["total_bytes"] == doc["other_bytes"] + sum(t["bytes"] for t in doc["tags"])


def test_cli_prints_the_tags_and_json(tmp_path):
    root = store(tmp_path / "res", rows_for("night-1", 1, 2, [1.0, 1.1]))
    out = hcp("results", f"results_dir={root}")
    assert out.returncode == 0, out.stderr
    assert "2 trial(s) in 1 key(s) under 1 env tag(s)" in out.stdout
    assert "night-1" in out.stdout
    out = hcp("results", f"results_dir={root}", "format=json")
    assert json.loads(out.stdout)["tags"][0]["trials"] == 2


def test_cli_bad_input_is_one_line_exit_2(tmp_path):
    for args, message in ((["results_dir=" + str(tmp_path / "nope")], "no such folder"),
                          (["format=xml", f"results_dir={tmp_path}"], "expected table or json"),
                          (["colour=red"], "results takes key=value arguments")):
        out = hcp("results", *args)
        assert out.returncode == 2 and message in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_results_never_opens_the_journal_nor_imports_torch_or_pandas(tmp_path):
    """It answers from the row folders: optuna (the journal's reader), pandas and torch stay
    unimported, and a journal that is not valid JSON does not matter."""
    root = store(tmp_path / "res", rows_for("night-1", 1, 2, [1.0]))
    (root / "optuna.journal").write_text("not a journal\n")
    code = ("import sys; from hcp_tune.cli import main; rc = main(['results', %r]); "
            "bad = {'optuna', 'pandas', 'torch'} & set(sys.modules); "
            "assert not bad, bad; sys.exit(rc)" % f"results_dir={root}")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "1 trial(s) in 1 key(s)" in r.stdout
