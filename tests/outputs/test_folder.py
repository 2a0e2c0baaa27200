"""``results``: what a results folder holds, per env tag, without reading the journal."""
import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import rows_for, store  # noqa: E402

from hcp_tune.store import housekeeping  # noqa: E402
from hcp_tune.store.folder import ResultStore  # noqa: E402
from hcp_tune.store.records import ROW_FILES  # noqa: E402
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
    row_files = list((root / "rows").glob(f"*/{ROW_FILES}"))
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


def _two_tags(root):
    """A folder of two tags, its rows imported into per-key journals by a rebuild."""
    rows = (rows_for("night-1", 1, 2, [1.0, 1.1]) + rows_for("night-1", 2, 1, [1.2], seq=8192)
            + rows_for("night-2", 1, 2, [1.0, 1.3]))
    store(root, rows)
    ResultStore(root).rebuild()
    return rows


def _tables(root):
    return {n: (root / n).read_bytes() for n in ("trials.csv", "recommendations.csv")}


def test_archive_moves_a_tags_keys_aside_and_the_tables_forget_them(tmp_path):
    root = tmp_path / "res"
    _two_tags(root)
    out = hcp("results", "archive", "env_tag=night-1", f"results_dir={root}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (f"env_tag=night-1: 2 key(s), 3 trial row(s) archived to "
                                  f"{root / 'archive' / 'night-1'}; the tables no longer list them")
    assert {r["env_tag"] for r in ResultStore(root).rows()} == {"night-2"}
    assert len(list((root / "journals").glob("*.journal"))) == 1
    assert "night-1" not in (root / "trials.csv").read_text()
    kept = _tables(root)
    ResultStore(root).rebuild_all()
    assert _tables(root) == kept  # what a rebuild of what is left writes
    archived = root / "archive" / "night-1"  # a results folder of its own
    ResultStore(archived).rebuild()
    assert sorted(r["median_s"] for r in ResultStore(archived).rows()) == [1.0, 1.1, 1.2]
    assert len(ResultStore(archived).recommendations()) == 2


def test_drop_deletes_a_tags_trials(tmp_path):
    root = tmp_path / "res"
    _two_tags(root)
    out = hcp("results", "drop", "env_tag=night-2", f"results_dir={root}")
    assert out.returncode == 0 and "1 key(s), 2 trial row(s) dropped" in out.stdout
    assert {r["env_tag"] for r in ResultStore(root).rows()} == {"night-1"}
    assert not (root / "archive").exists() and not list(root.glob(".taking-*"))
    assert [r["env_tag"] for r in ResultStore(root).recommendations()] == ["night-1"] * 2


def test_drop_refuses_while_a_sweep_runs_and_ignores_a_dead_sweeps_marker(tmp_path):
    root = tmp_path / "res"
    _two_tags(root)
    store_ = ResultStore(root)
    marker = housekeeping.mark_sweep(store_)  # this process: alive
    out = hcp("results", "drop", "env_tag=night-1", f"results_dir={root}")
    assert out.returncode == 2 and "a sweep is running on this folder" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert len(ResultStore(root).rows()) == 5  # nothing touched
    housekeeping.unmark_sweep(marker)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (root / "sweeps" / f"{os.uname().nodename}-{dead}-x.running").write_text(json.dumps(
        {"host": os.uname().nodename, "pid": int(dead), "argv": []}))  # killed with SIGKILL
    # and one killed while it wrote its marker: the unrenamed half is no sweep
    (root / "sweeps" / f".tmp-k3x9{os.uname().nodename}-{dead}-y.running").write_text('{"ho')
    out = hcp("results", "drop", "env_tag=night-1", f"results_dir={root}")
    assert out.returncode == 0, out.stderr
    assert not list((root / "sweeps").glob("[!.]*.running"))


def test_drop_and_archive_bad_input_is_one_line_exit_2(tmp_path):
    root = tmp_path / "res"
    _two_tags(root)
    (root / "archive" / "night-2").mkdir(parents=True)
    for args, message in ((["drop", f"results_dir={root}"], "give env_tag=TAG"),
                          (["drop", "env_tag=nope", f"results_dir={root}"],
                           "no such tag in " + str(root) + "; it holds night-1, night-2"),
                          (["archive", "env_tag=night-2", f"results_dir={root}"],
                           "that tag was archived before"),
                          (["drop", "env_tag=x", f"results_dir={tmp_path / 'nope'}"],
                           "no such folder"),
                          (["archive", "tag=x"], "results archive takes key=value")):
        out = hcp("results", *args)
        assert out.returncode == 2 and message in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert len(ResultStore(root).rows()) == 5
