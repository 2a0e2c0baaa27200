"""The ``regress`` and ``report`` commands: read stored trials, write Markdown and HTML.

Neither imports torch or pandas. ``regress`` exits 1 when a change is confirmed, 4 when
nothing is confirmed but a layout is inconclusive, 0 otherwise (``Comparison.exit_code``);
bad input is one line and exit 2. ``regress power ...`` and ``regress run ...`` are in
``plan.py``; the arguments and files in ``args.py``.
"""
from __future__ import annotations

from pathlib import Path

from hcp_tune.outputs.regress.args import (
    REGRESS_KEYS,
    REPORT_KEYS,
    _flag,
    _rows,
    history_rows,
    options,
    parse_args,
    slug,
    split_args,
    run_sweep,
    write_report,
)
from hcp_tune.outputs.regress.rows import RegressError
from hcp_tune.spec import atomic_write_text


def _every_key(results_dir: Path, pick: dict) -> list:
    """``report.summarize`` of every stored key, reading one key folder at a time (the
    folder's rows are dropped once summarised: memory holds one key's rows, not every
    row the folder ever stored), in the key order one call over every row gives."""
    from hcp_tune.store.records import KEY_FIELDS
    from hcp_tune.store.folder import ResultStore
    from hcp_tune.outputs import report

    store = ResultStore(results_dir)
    store.refresh()
    slugs = store.folder_keys()
    if not slugs:
        _rows(results_dir)  # raises: nothing stored there
    profiles: dict = {}
    keys = [k for slug in slugs for k in report.summarize(
        store.slug_rows(slug), **pick, profiles=profiles)]
    return sorted(keys, key=lambda k: str(tuple(k.key.get(f) for f in KEY_FIELDS)))


def cmd_regress(args: list[str]) -> int:
    import hcp_tune.outputs.regress.model as model

    if args and args[0] in ("power", "run"):
        import hcp_tune.outputs.regress.plan as plan

        return (plan.cmd_power if args[0] == "power" else plan.cmd_run)(args[1:])
    a = parse_args("regress", args, REGRESS_KEYS)
    opts = options(a, "interleaved" if _flag(a, "paired", False) else "sessions")
    results_dir = Path(a.get("results_dir", "results")).resolve()
    tags = {opts.baseline, opts.candidate}
    if _flag(a, "settle", False):
        report = _settle(a, opts, results_dir, tags)
    else:
        for key in ("candidate_args", "baseline_args"):
            if key in a:
                raise RegressError(f"{key}={a[key]}: only used with settle=true (the sweeps "
                                   "that settle inconclusive layouts); add settle=true")
        rows = _rows(results_dir, tags)
        try:
            report = model.compare(rows, opts, history=history_rows(results_dir, tags))
        except RegressError:  # raised again from every row: the message lists every tag there
            report = model.compare(_rows(results_dir), opts)
        return write_report(report, results_dir, rows)
    return write_report(report, results_dir, _rows(results_dir, tags))


def _settle(a: dict[str, str], opts, results_dir: Path, tags: set[str]):
    """``settle=true``: sweeps as child processes into the same results_dir (the candidate
    in this environment, the baseline only with ``baseline_args=``)."""
    from hcp_tune.outputs.regress.settle import settle

    # every look reads the other tags' rows of these keys too: the spreads' history
    history = history_rows(results_dir, tags)
    report, _ = settle(lambda: _rows(results_dir, tags) + history, run_sweep, opts,
                       candidate_args=split_args(a, "candidate_args", results_dir)
                       if "candidate_args" in a else [f"results_dir={results_dir}"],
                       baseline_args=split_args(a, "baseline_args", results_dir)
                       if "baseline_args" in a else None)
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
    from hcp_tune.outputs.ui import say

    say(f"report: {len(keys)} key(s), {ranked} measured layout(s); wrote {out}")
    return 0
