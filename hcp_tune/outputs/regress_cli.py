"""The ``regress`` and ``report`` commands: read stored trials, write Markdown and HTML.

Both take plain ``key=value`` arguments (not Hydra: they read what sweeps stored and need
no profile). Neither imports torch or pandas. A bad argument is a ``RegressError`` (exit
2, one line); ``regress`` exits 1 when a change is confirmed, 4 when nothing is confirmed
but a layout is inconclusive, 0 otherwise (``Comparison.exit_code``).
"""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Optional

from hcp_tune.outputs.regress import RegressError
from hcp_tune.spec import atomic_write_text

REGRESS_KEYS = ("baseline", "candidate", "results_dir", "cluster", "model", "threshold",
                "mem_threshold", "seed", "ci", "noise_floor", "max_trials", "settle",
                "candidate_args", "baseline_args", "confirm_trials")
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
    from hcp_tune.engine.store import ResultStore

    existing_dir(results_dir)  # the one wording for a missing folder
    if env_tags:
        rows = ResultStore(results_dir).tag_rows(env_tags)
        if {str(r.get("env_tag")) for r in rows} >= env_tags:
            return rows
    rows = ResultStore(results_dir).rows()
    if not rows:
        raise RegressError(f"results_dir={results_dir}: no stored trials there (rows/*/*.json); "
                           "run `python -m hcp_tune sweep ... env_tag=NAME` first")
    return rows


def _every_key(results_dir: Path, pick: dict) -> list:
    """``report.summarize`` of every stored key, reading one key folder at a time (the
    folder's rows are dropped once summarised: memory holds one key's rows, not every
    row the folder ever stored), in the key order one call over every row gives."""
    from hcp_tune.engine.records import KEY_FIELDS
    from hcp_tune.engine.store import ResultStore
    from hcp_tune.outputs import report

    store = ResultStore(results_dir)
    slugs = store.folder_keys()
    if not slugs:
        _rows(results_dir)  # raises: nothing stored there
    profiles: dict = {}
    keys = [k for slug in slugs for k in report.summarize(
        store.slug_rows(slug), **pick, profiles=profiles)]
    return sorted(keys, key=lambda k: str(tuple(k.key.get(f) for f in KEY_FIELDS)))


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


def cmd_regress(args: list[str]) -> int:
    from hcp_tune.outputs import html_report, regress, regress_view

    a = parse_args("regress", args, REGRESS_KEYS)
    missing = [k for k in ("baseline", "candidate") if k not in a]
    if missing:
        raise RegressError(f"regress needs {' and '.join(f'{k}=TAG' for k in missing)}, e.g. "
                           "regress baseline=te-2.9 candidate=te-2.10")
    opts = regress.Options(
        baseline=a["baseline"], candidate=a["candidate"], cluster=a.get("cluster"),
        model=a.get("model"), threshold=_number(a, "threshold", 0.05),
        mem_threshold=_number(a, "mem_threshold", 0.05), seed=_number(a, "seed", 0, int),
        ci=_number(a, "ci", regress.CI_LEVEL), noise_floor=_flag(a, "noise_floor", True),
        max_trials=_number(a, "max_trials", regress.MAX_TRIALS, int),
        confirm_trials=_number(a, "confirm_trials", regress.CONFIRM_TRIALS, int))
    results_dir = Path(a.get("results_dir", "results")).resolve()
    tags = {opts.baseline, opts.candidate}
    if _flag(a, "settle", False):
        report = _settle(a, opts, results_dir, tags)
    else:
        for key in ("candidate_args", "baseline_args"):
            if key in a:
                raise RegressError(f"{key}={a[key]}: only used with settle=true (the sweeps "
                                   "that settle inconclusive layouts); add settle=true")
        try:
            report = regress.compare(_rows(results_dir, tags), opts)
        except RegressError:  # raised again from every row: the message lists every tag there
            report = regress.compare(_rows(results_dir), opts)
    stem = results_dir / f"regress-{slug(opts.baseline)}-vs-{slug(opts.candidate)}"
    md, page = stem.with_suffix(".md"), stem.with_suffix(".html")
    atomic_write_text(str(md), regress_view.markdown(report))
    atomic_write_text(str(page), html_report.regress_page(report))
    regress_view.print_report(report, [str(md), str(page)])
    return report.exit_code


def _settle(a: dict[str, str], opts, results_dir: Path, tags: set[str]):
    """``settle=true``: sweeps as child processes into the same results_dir (the candidate
    in this environment, the baseline only with ``baseline_args=``)."""
    from hcp_tune.outputs.regress_settle import settle

    def split(key: str) -> list[str]:
        try:
            return shlex.split(a[key]) + [f"results_dir={results_dir}"]
        except ValueError as e:
            raise RegressError(f"{key}={a[key]!r}: {e}; expected sweep overrides, e.g. "
                               f"{key}='executor=local'") from None

    def run_sweep(args: list[str]) -> int:
        sys.stdout.flush()
        return subprocess.run([sys.executable, "-m", "hcp_tune", *args]).returncode

    report, _ = settle(lambda: _rows(results_dir, tags), run_sweep, opts,
                       candidate_args=split("candidate_args") if "candidate_args" in a
                       else [f"results_dir={results_dir}"],
                       baseline_args=split("baseline_args") if "baseline_args" in a else None)
    return report


def cmd_report(args: list[str]) -> int:
    from hcp_tune.outputs import html_report, report

    a = parse_args("report", args, REPORT_KEYS)
    results_dir = Path(a.get("results_dir", "results")).resolve()
    pick = {"results_dir": results_dir, "env_tag": a.get("env_tag"),
            "cluster": a.get("cluster"), "model": a.get("model")}
    if "env_tag" in a:
        keys = report.summarize(_rows(results_dir, {a["env_tag"]}), **pick)
    else:
        keys = _every_key(results_dir, pick)
    if not keys:
        tags = sorted({str(r.get("env_tag")) for r in _rows(results_dir)})
        raise RegressError(f"no stored trials match {' '.join(f'{k}={a[k]}' for k in a if k in ('env_tag', 'cluster', 'model'))}"
                           f" in {results_dir}; env tags there: {', '.join(tags)}")
    name = f"report-{slug(a['env_tag'])}.html" if "env_tag" in a else "report.html"
    out = Path(a["out"]).resolve() if "out" in a else results_dir / name
    atomic_write_text(str(out), html_report.report_page(keys, f"hcp-tune report: {results_dir}"))
    ranked = sum(len(k.layouts) for k in keys)
    print(f"report: {len(keys)} key(s), {ranked} measured layout(s); wrote {out}")
    return 0
