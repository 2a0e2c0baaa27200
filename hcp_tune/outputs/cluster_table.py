"""``recommend cluster=NAME`` with no key: every key measured on a cluster, one line each.

What a team lead reads before handing out Bridge settings: per model, tp, cp, pp and seq
the recommended ``[a2a,p2p]``, its figure (the best layout's median step), its verdict
(``settled``/``tie``/``unsettled`` where recommendations.csv has the ``verdict`` column,
``—`` where it predates it), the env tag it was measured under and the date its last trial
was stored. With no ``env_tag=`` each key shows its newest tag and the tags there are named;
``format=csv|json|md`` gives the same rows with the Bridge overrides. Reads
``recommendations.csv`` and one folder date per key; never measures, never loads a profile.
"""
from __future__ import annotations

import csv
import io
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

from hcp_tune.store.records import KEY_FIELDS, SweepKey, key_field
from hcp_tune.errors import EXIT_NOT_FOUND, EXIT_OK, InputFileError
from hcp_tune.space.layout import Layout

# recommend's arguments that select keys without naming one; any other makes it one key
LISTING_ARGS = ("cluster", "model", "env_tag", "runner", "format", "results_dir")
FORMATS = ("table", "csv", "json", "md")
COLUMNS = ("cluster", "model", "tp", "pp", "cp", "seq", "mix", "runner", "a2a", "p2p", "comm_type",
           "median_s", "verdict", "env_tag", "date", "trials", "bridge_overrides")
NO_VERDICT = "—"  # recommendations.csv written before it had a verdict column


def is_listing(args: list[str]) -> bool:
    """``recommend`` asked for no key (no cp, seq, tp, ...): list the cluster's keys."""
    return all(a.partition("=")[0] in LISTING_ARGS and "=" in a for a in args)


def _args(args: list[str]) -> dict[str, str]:
    got = dict(a.split("=", 1) for a in args)
    fmt = got.setdefault("format", "table")
    if fmt not in FORMATS:
        raise InputFileError(f"format={fmt!r}: the listing of a cluster's keys is one of "
                             f"{', '.join(FORMATS)}")
    return got


def _date(root: Path, rec: dict[str, Any]) -> str:
    """When the key's last trial was stored: its row folder's time (a row is renamed in)."""
    try:
        stamp = (root / "rows" / SweepKey.of(rec).slug).stat().st_mtime
    except OSError:
        return ""
    return time.strftime("%Y-%m-%d", time.localtime(stamp))


def listing(recs: list[dict[str, Any]], root: Path, want: dict[str, str]
            ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """(one row per measured key, newest tag unless ``env_tag`` is given; the count of keys
    per env tag among the selected recommendations)."""
    picked = [r for r in recs if all(str(r.get(k)) == want[k]
                                     for k in ("cluster", "model", "env_tag", "runner")
                                     if k in want)]
    tags: dict[str, int] = {}
    newest: dict[tuple, dict[str, Any]] = {}
    for r in picked:
        tags[str(r["env_tag"])] = tags.get(str(r["env_tag"]), 0) + 1
        row = {**r, "date": _date(root, r)}
        key = tuple(key_field(r, k) for k in KEY_FIELDS if k != "env_tag")
        if key not in newest or (row["date"], str(r["env_tag"])) > \
                (newest[key]["date"], str(newest[key]["env_tag"])):
            newest[key] = row
    rows = [_shown(r) for r in newest.values()]
    rows.sort(key=lambda r: (r["cluster"], r["model"], r["tp"], r["pp"], r["cp"], r["seq"],
                             r["mix"], r["runner"]))
    return rows, dict(sorted(tags.items()))


def _shown(r: dict[str, Any]) -> dict[str, Any]:
    layout = Layout(int(r["a2a"]), int(r["p2p"]))
    out = {c: key_field(r, c) if c in KEY_FIELDS else r.get(c) for c in COLUMNS}
    verdict = r.get("verdict")
    out["verdict"] = str(verdict) if verdict not in (None, "") else NO_VERDICT
    out["bridge_overrides"] = " ".join(layout.bridge_overrides())
    return out


def _figure(seconds: Optional[float]) -> str:
    from hcp_tune.outputs.ui import human_time

    return human_time(float(seconds)) if seconds not in (None, "") else "-"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


TABLE = ("{model:<14} {tp:>3} {pp:>3} {cp:>4} {seq:>8} {best:<8} {comm:<7} {fig:>9} "
         "{verdict:<9} {env_tag:<14} {date:<10}")
# packed keys (data.packing=thd) are listed apart, their length mix beside seq
PACKED = ("{model:<10} {tp:>3} {pp:>3} {cp:>4} {seq:>7} {mix:<10} {best:<8} {comm:<7} {fig:>9} "
          "{verdict:<9} {env_tag:<9} {date:<10}")


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line of at most 100 columns per key, under a header: the fixed-length keys,
    then the packed ones (each with its length mix) under a header of their own."""
    head = dict(model="model", tp="tp", pp="pp", cp="cp", seq="seq", mix="mix", best="best",
                comm="comm", fig="median", verdict="verdict", env_tag="env_tag", date="stored")
    fixed = [r for r in rows if not r.get("mix")]
    packed = [r for r in rows if r.get("mix")]
    lines = []
    for form, group, (mw, ew) in ((TABLE, fixed, (14, 14)), (PACKED, packed, (10, 9))):
        if not group:
            continue
        if form is PACKED:
            lines += ([""] if lines else []) + [
                "packed sequences (data.packing=thd data.lengths=MIX; mix: name#hash):"]
        lines.append(form.format(**head).rstrip())
        for r in group:
            lines.append(form.format(
                model=_cut(str(r["model"]), mw), tp=r["tp"],
                pp=r["pp"], cp=r["cp"], seq=r["seq"], mix=_cut(str(r.get("mix") or ""), 10),
                best=f"[{r['a2a']},{r['p2p']}]", comm=r["comm_type"], fig=_figure(r["median_s"]),
                verdict=_cut(str(r["verdict"]), 9), env_tag=_cut(str(r["env_tag"]), ew),
                date=r["date"] or "-").rstrip())
    return lines


def render(rows: list[dict[str, Any]], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=2, default=str)
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(COLUMNS), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue().rstrip("\n")
    if fmt == "md":
        cols = [c for c in COLUMNS if c not in ("a2a", "p2p")]
        out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in rows:
            cells = [f"`{r[c]}`" if c == "bridge_overrides" else str(r[c]) for c in cols]
            out.append("| " + " | ".join(cells) + " |")
        return "\n".join(out)
    return "\n".join(table_lines(rows))


def cmd_listing(args: list[str]) -> int:
    """``recommend [cluster=NAME] [model=M] [env_tag=T] [format=table|csv|json|md]``."""
    from hcp_tune.config import existing_dir
    from hcp_tune.store.folder import ResultStore
    from hcp_tune.outputs.ui import say

    want = _args(args)
    fmt = want.pop("format")
    root = existing_dir(Path(want.pop("results_dir", "results")).resolve())
    recs = ResultStore(root).recommendations()
    rows, tags = listing(recs, root, want)
    what = " ".join(f"{k}={v}" for k, v in want.items()) or "any cluster"
    if not rows:
        clusters = sorted({str(r["cluster"]) for r in recs})
        say(f"recommend: nothing measured for {what} in {root}/recommendations.csv",
            f"clusters measured there: {', '.join(clusters)}" if clusters else
            "nothing has been measured there yet: run `python -m hcp_tune sweep ...` first")
        return EXIT_NOT_FOUND
    if "env_tag" not in want:  # on stderr beside csv/json, so stdout stays machine-read
        note = (f"recommend: {len(rows)} key(s) of {what}, each under its newest env tag; "
                f"tags here: {', '.join(f'{t} ({n} key(s))' for t, n in tags.items())}; "
                "env_tag=NAME shows one")
        if fmt == "table":
            say(note)
        else:
            print(note, file=sys.stderr)
    print(render(rows, fmt))
    if fmt == "table":
        from hcp_tune.engine.error_rates import AGREEMENT, SETTLED_ERROR

        shown = {r["verdict"] for r in rows}
        if shown & {"settled", "tie", "unsettled"}:  # every verdict printed states its error
            say("", f"verdicts: settled: {SETTLED_ERROR}; tie: {AGREEMENT}; unsettled: "
                "`recommend` of that key prints the command that measures its undecided "
                "layouts")
        say("", "Bridge overrides of a row: model.context_parallel_size=CP "
            "model.cp_comm_type=COMM model.hierarchical_context_parallel_sizes=[A2A,P2P] "
            "(format=csv|json|md lists them per key)")
    sys.stdout.flush()
    return EXIT_OK
