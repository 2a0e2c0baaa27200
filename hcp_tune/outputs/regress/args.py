"""The plain ``key=value`` arguments of ``regress`` and ``report`` (not Hydra: they read
what sweeps stored and need no profile): parsing, the stored rows, the options, the files
written, and the sweeps run as child processes. A bad argument is a ``RegressError`` (exit
2, one line).
"""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Optional

from hcp_tune.outputs.regress.rows import RegressError
from hcp_tune.spec import atomic_write_text

OPTION_KEYS = ("baseline", "candidate", "results_dir", "cluster", "model", "threshold",
               "mem_threshold", "alpha", "ci", "max_trials", "session_spread", "layout_spread")
REGRESS_KEYS = OPTION_KEYS + ("settle", "candidate_args", "baseline_args", "paired")
REPORT_KEYS = ("results_dir", "env_tag", "cluster", "model", "out")


def parse_args(command: str, args: list[str], allowed: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep or key not in allowed:
            raise RegressError(f"{arg}: {command} takes key=value arguments: {', '.join(allowed)}")
        if not value:
            raise RegressError(f"{arg}: give a value, e.g. {key}=...")
        out[key] = value
    return out


def _number(args: dict[str, str], key: str, default, kind=float):
    try:
        return kind(args.get(key, default))
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise RegressError(f"{key}={args[key]!r}: expected {what}, e.g. {key}={default}") from None


def _rows(results_dir: Path, env_tags: Optional[set[str]] = None) -> list[dict]:
    """The stored rows (``env_tags``: of those tags' keys only, reading only their folders;
    when one of them has no rows, every row, so that the error lists the tags there)."""
    from hcp_tune.config import existing_dir
    from hcp_tune.store.folder import ResultStore

    existing_dir(results_dir)  # the one wording for a missing folder
    store = ResultStore(results_dir)
    store.refresh()  # a view of a team's database: brought up to date first
    if env_tags:
        rows = store.tag_rows(env_tags)
        if {str(r.get("env_tag")) for r in rows} >= env_tags:
            return rows
    rows = store.rows()
    if not rows:
        raise RegressError(f"results_dir={results_dir}: no stored trials there (rows/*/*.json); "
                           "run `python -m hcp_tune sweep ... env_tag=NAME` first")
    return rows


def history_rows(results_dir: Path, env_tags: set[str]) -> list[dict]:
    """The rows other tags stored for the keys ``env_tags`` measured (the folders of those
    keys only): the sessions ``spread.from_history`` may learn S and L from."""
    from hcp_tune.store.folder import ResultStore
    from hcp_tune.outputs.regress.rows import COMPARED

    store = ResultStore(results_dir)
    keys = store.folder_keys()
    same = lambda k: tuple(getattr(k, f) for f in COMPARED)  # noqa: E731
    mine = {same(k) for k in keys.values() if str(k.env_tag) in env_tags}
    return [r for slug, k in keys.items() if str(k.env_tag) not in env_tags
            and same(k) in mine for r in store.slug_rows(slug)]


def _flag(args: dict[str, str], key: str, default: bool) -> bool:
    value = args.get(key, str(default)).lower()
    if value not in ("true", "false"):
        raise RegressError(f"{key}={args[key]!r}: expected true or false, e.g. "
                           f"{key}={str(default).lower()}")
    return value == "true"


def slug(text: str) -> str:
    """A tag as part of a file name: a name (letters, digits, . _ -, what env_tag allows)
    as it is, anything else percent-encoded, so two tags never share a file ('a/b' ->
    'a%2Fb', 'a_b' -> 'a_b')."""
    from urllib.parse import quote

    return quote(text, safe="").replace("~", "%7E")


def options(a: dict[str, str], design: str = "sessions"):
    import hcp_tune.outputs.regress.model as model
    from hcp_tune.outputs.regress.spread import parse_fraction

    missing = [k for k in ("baseline", "candidate") if k not in a]
    if missing:
        raise RegressError(f"regress needs {' and '.join(f'{k}=TAG' for k in missing)}, e.g. "
                           "regress baseline=te-2.9 candidate=te-2.10")
    return model.Options(
        baseline=a["baseline"], candidate=a["candidate"], cluster=a.get("cluster"),
        model=a.get("model"), threshold=_number(a, "threshold", 0.05),
        mem_threshold=_number(a, "mem_threshold", 0.05), alpha=_number(a, "alpha", 0.05),
        ci=_number(a, "ci", 0.95), design=design,
        max_trials=_number(a, "max_trials", model.MAX_TRIALS, int),
        session_spread=parse_fraction(a, "session_spread"),
        layout_spread=parse_fraction(a, "layout_spread"))


def report_stem(results_dir: Path, baseline: str, candidate: str) -> Path:
    """``regress-<baseline>-vs-<candidate>`` with the whole tags (``te-2.10`` keeps its
    ``.10``): the caller adds the suffix to the name, never ``with_suffix``."""
    return results_dir / f"regress-{slug(baseline)}-vs-{slug(candidate)}"


def write_report(report, results_dir: Path, rows: Optional[list[dict]] = None) -> int:
    """The Markdown and HTML files, then the terminal table; the exit code (the report's:
    a known upstream cause found in ``rows``' stacks is printed, never counted out)."""
    from hcp_tune.outputs import html_report
    import hcp_tune.outputs.regress.known as known_causes
    import hcp_tune.outputs.regress.view as view

    known = known_causes.match(report, rows) if rows else {}
    stem = report_stem(results_dir, report.options.baseline, report.options.candidate)
    md, page = Path(f"{stem}.md"), Path(f"{stem}.html")
    atomic_write_text(str(md), view.markdown(report, known))
    atomic_write_text(str(page), html_report.regress_page(report))
    view.print_report(report, [str(md), str(page)], known)
    return report.exit_code


def split_args(a: dict[str, str], key: str, results_dir: Path) -> list[str]:
    """``baseline_args=``/``candidate_args=`` as sweep overrides, into ``results_dir``."""
    try:
        return shlex.split(a[key]) + [f"results_dir={results_dir}"]
    except ValueError as e:
        raise RegressError(f"{key}={a[key]!r}: {e}; expected sweep overrides, e.g. "
                           f"{key}='executor=local'") from None


def run_sweep(args: list[str]) -> int:
    """``python -m hcp_tune sweep ...`` as a child process (regress imports no torch)."""
    sys.stdout.flush()
    return subprocess.run([sys.executable, "-m", "hcp_tune", *args]).returncode
