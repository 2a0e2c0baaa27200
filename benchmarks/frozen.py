"""Whether a rule's files are still as they were frozen: the held-out discipline of the
benchmarks that publish error rates (synthetic_loop, regress_nights).

A file counts as unchanged when its code is the code at the freeze commit. Two things
that are not the rule may differ: where the file lies (a package reorganised since the
freeze: ``MOVED`` says where each moved file was) and the module paths in its imports of
this package (``from hcp_tune.engine import shrinkage`` reading ``from hcp_tune.stats
import shrinkage`` imports the same code). Python files are compared as syntax trees with
those module paths blanked, so a changed constant, expression, docstring or name imported
is a change; other files (YAML) byte for byte. Uncommitted edits count.
"""
from __future__ import annotations

import ast
import subprocess
from pathlib import Path
from typing import Iterable, Optional

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "hcp_tune"

# Files moved since a freeze: path now -> path then. Issue 39 gave the results store and
# the ranking's statistics packages of their own below the engine (one commit, git log
# --follow shows it); the files' code did not change.
MOVED = {
    "hcp_tune/stats/verdict.py": "hcp_tune/engine/verdict.py",
    "hcp_tune/stats/shrinkage.py": "hcp_tune/engine/shrinkage.py",
}


def code_of(text: str, path: str) -> str:
    """What is compared: a Python file's syntax tree with this package's import paths
    blanked (the names imported are kept); any other file's text."""
    if not path.endswith(".py"):
        return text
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == PACKAGE:
            node.module = PACKAGE
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    alias.name = PACKAGE + "." + alias.name.rsplit(".", 1)[-1]
    return ast.dump(tree)


def changed_since(commit: str, files: Iterable[str], repo: Path = REPO) -> Optional[list[str]]:
    """The files (paths now) whose code differs from ``commit``'s, [] when none does;
    None when ``commit`` is not in the repository."""
    known = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet",
                            f"{commit}^{{commit}}"], capture_output=True, text=True)
    if known.returncode != 0:
        return None
    out = []
    for now in files:
        then = MOVED.get(now, now)
        old = subprocess.run(["git", "-C", str(repo), "show", f"{commit}:{then}"],
                             capture_output=True, text=True)
        path = repo / now
        if old.returncode != 0 or not path.is_file() \
                or code_of(old.stdout, then) != code_of(path.read_text(), now):
            out.append(now)
    return out
