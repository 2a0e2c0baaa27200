"""benchmarks/frozen.py: the check that says whether the published error rates are still
held out. It must follow a file that moved and ignore its imports' module paths, and still
see any change to the rule's code."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import frozen  # noqa: E402

RULE = '''"""A rule."""
from hcp_tune.engine import shrinkage
import hcp_tune.engine.records

LEVEL = 0.95


def decide(x):
    return shrinkage.moderate(x) > LEVEL
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@example.org")
    git(tmp_path, "config", "user.name", "t")
    (tmp_path / "hcp_tune/engine").mkdir(parents=True)
    (tmp_path / "hcp_tune/engine/verdict.py").write_text(RULE)
    (tmp_path / "rule.yaml").write_text("level: 0.95\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "freeze")
    return tmp_path, git(tmp_path, "rev-parse", "HEAD")


def moved(repo: Path, text: str) -> None:
    (repo / "hcp_tune/stats").mkdir(exist_ok=True)
    (repo / "hcp_tune/stats/verdict.py").write_text(text)
    (repo / "hcp_tune/engine/verdict.py").unlink(missing_ok=True)


def test_a_moved_rule_whose_imports_name_the_new_package_is_unchanged(repo):
    root, commit = repo
    moved(root, RULE.replace("hcp_tune.engine import", "hcp_tune.stats import")
          .replace("import hcp_tune.engine.records", "import hcp_tune.store.records"))
    assert frozen.changed_since(commit, ["hcp_tune/stats/verdict.py", "rule.yaml"], root) == []


@pytest.mark.parametrize("edit", [
    ("LEVEL = 0.95", "LEVEL = 0.9"),  # a constant
    ("> LEVEL", ">= LEVEL"),  # an expression
    ("import shrinkage", "import shrinkage as moderate_spreads"),  # what is imported
    ('"""A rule."""', '"""Another rule."""'),  # its docstring
])
def test_any_change_to_a_moved_rules_code_is_a_change(repo, edit):
    root, commit = repo
    moved(root, RULE.replace(*edit))
    assert frozen.changed_since(commit, ["hcp_tune/stats/verdict.py"], root) == [
        "hcp_tune/stats/verdict.py"]


def test_a_yaml_rule_is_compared_byte_for_byte_and_an_unknown_commit_is_none(repo):
    root, commit = repo
    (root / "rule.yaml").write_text("level: 0.950\n")
    assert frozen.changed_since(commit, ["rule.yaml"], root) == ["rule.yaml"]
    assert frozen.changed_since("0" * 40, ["rule.yaml"], root) is None


def test_the_ranking_and_regress_rules_are_as_frozen():
    """The published held-out rates (RESULTS-decision-cost, -interval-coverage, -power-rule,
    -regress-error-rates) stand only while the rule files are as frozen: a change to one
    must come with a new freeze and new held-out runs, not pass unnoticed."""
    import regress_nights
    import synthetic_loop

    for commit, files in ((synthetic_loop.FROZEN_AT, synthetic_loop.RULE_FILES),
                          (regress_nights.FROZEN_AT, regress_nights.RULE_FILES)):
        changed = frozen.changed_since(commit, files)
        if changed is None:
            pytest.skip(f"freeze commit {commit} is not in this clone's history")
        assert changed == [], f"changed since the freeze at {commit}: {changed}"
