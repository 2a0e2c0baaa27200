"""The ``regress`` and ``report`` commands: read stored trials, write Markdown and HTML.

Both take plain ``key=value`` arguments (not Hydra: they read what sweeps stored and need
no profile). Neither imports torch or pandas. A bad argument is a ``RegressError`` (exit
2, one line); ``regress`` exits 1 when anything is flagged, 0 otherwise.
"""
from __future__ import annotations

from pathlib import Path

from hcp_tune.outputs.regress import RegressError
from hcp_tune.spec import atomic_write_text

REGRESS_KEYS = ("baseline", "candidate", "results_dir", "cluster", "model", "threshold",
                "mem_threshold", "seed")
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


def _rows(results_dir: Path) -> list[dict]:
    from hcp_tune.engine.store import ResultStore

    rows = ResultStore(results_dir).rows()
    if not rows:
        raise RegressError(f"results_dir={results_dir}: no stored trials there (rows/*/*.json); "
                           "run `python -m hcp_tune sweep ... env_tag=NAME` first")
    return rows


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
        mem_threshold=_number(a, "mem_threshold", 0.05), seed=_number(a, "seed", 0, int))
    results_dir = Path(a.get("results_dir", "results")).resolve()
    report = regress.compare(_rows(results_dir), opts)
    stem = results_dir / f"regress-{slug(opts.baseline)}-vs-{slug(opts.candidate)}"
    md, page = stem.with_suffix(".md"), stem.with_suffix(".html")
    atomic_write_text(str(md), regress_view.markdown(report))
    atomic_write_text(str(page), html_report.regress_page(report))
    regress_view.print_report(report, [str(md), str(page)])
    return report.exit_code


def cmd_report(args: list[str]) -> int:
    from hcp_tune.outputs import html_report, report

    a = parse_args("report", args, REPORT_KEYS)
    results_dir = Path(a.get("results_dir", "results")).resolve()
    rows = _rows(results_dir)
    keys = report.summarize(rows, results_dir=results_dir, env_tag=a.get("env_tag"),
                            cluster=a.get("cluster"), model=a.get("model"))
    if not keys:
        tags = sorted({str(r.get("env_tag")) for r in rows})
        raise RegressError(f"no stored trials match {' '.join(f'{k}={a[k]}' for k in a if k in ('env_tag', 'cluster', 'model'))}"
                           f" in {results_dir}; env tags there: {', '.join(tags)}")
    name = f"report-{slug(a['env_tag'])}.html" if "env_tag" in a else "report.html"
    out = Path(a["out"]).resolve() if "out" in a else results_dir / name
    atomic_write_text(str(out), html_report.report_page(keys, f"hcp-tune report: {results_dir}"))
    ranked = sum(len(k.layouts) for k in keys)
    print(f"report: {len(keys)} key(s), {ranked} measured layout(s); wrote {out}")
    return 0
