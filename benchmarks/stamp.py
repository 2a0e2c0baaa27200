"""The stamp every benchmark script puts at the top of the results file it writes.

What belongs here: one function that writes a ``benchmarks/RESULTS-*.md`` with a stamp of
how it was made (the command, the date, the git commit and whether the tree was dirty,
the machine, the load average), so a figure in the docs always traces to a run. The
docs site's performance pages (scripts/docs_pages.py) read this stamp back.
"""
from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    try:
        # rstrip, not strip: a porcelain line starts with a space (" M path")
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True,
                              text=True, timeout=10).stdout.rstrip("\n")
    except (OSError, subprocess.SubprocessError):
        return ""


def stamp(argv: list[str] | None = None) -> str:
    """The stamp block (an HTML comment, invisible when rendered) for this run."""
    argv = sys.argv if argv is None else argv
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    # (a porcelain line is "XY path"; the output's first space may have been stripped)
    changed = [line.split(maxsplit=1)[-1] for line in
               _git("status", "--porcelain", "--untracked-files=no").splitlines()
               if "benchmarks/RESULTS-" not in line]  # the files it writes
    if changed:
        commit += " (with uncommitted changes to " + ", ".join(changed) + ")"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}"
    lines = {
        "command": "python " + shlex.join([os.path.relpath(argv[0], REPO), *argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "machine": machine,
        "load": f"{load} (1, 5, 15 min) at the end of the run",
    }
    return "<!-- stamp\n" + "\n".join(f"{k}: {v}" for k, v in lines.items()) + "\n-->\n"


def write_results(path: str | Path, text: str, argv: list[str] | None = None) -> None:
    """Write a results file: the stamp, then ``text``."""
    Path(path).write_text(stamp(argv) + text.rstrip("\n") + "\n")


def write_simulation(path: str | Path, title: str, doc: str, table: list[str],
                     closing: str) -> None:
    """A simulation benchmark's results file: its title, the command that made it, the
    first two paragraphs after the summary line of its docstring ``doc`` (what is
    simulated, and how), its table and a closing line; says where it wrote."""
    paragraphs = [p.replace("\n", " ") for p in doc.split("\n\n")[1:3]]
    body = [f"# {title}", "", "```", "PYTHONPATH=$PWD python " + " ".join(sys.argv), "```",
            "", *(x for p in paragraphs for x in (p, "")), *table, "", closing]
    write_results(path, "\n".join(body))
    print(f"wrote {path}")
