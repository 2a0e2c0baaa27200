"""The cost model's output: ``predict``'s table of PREDICTED step times and the
too-close-to-call groups (``costmodel.predict.close_groups``) that ``predict``, ``plan``
and ``recommend`` print. Every number here is labelled predicted; the measured views are
in ``ui``."""
from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from hcp_tune.outputs.ui import TABLE_WIDTH, console, human_time, print_notes, say


def _crossing(r: dict[str, Any]) -> list[str]:
    """``crosses nodes: a2a`` (or p2p, a2a+p2p) for a layout with a level that leaves a node."""
    return [f"crosses nodes: {r['crosses_nodes']}"] if r.get("crosses_nodes", "-") != "-" else []


def close_group_lines(pred: dict[str, Any]) -> list[str]:
    """Per key: the too-close-to-call group (or the confident pick) in one line, and for a
    group the ``sweep`` that measures only it (``predict.close_groups``)."""
    b, lines = pred.get("band"), []
    for g in pred.get("close_groups", []):
        lays = ", ".join(f"[{a},{p}]" for a, p in zip(g["a2a_sizes"], g["p2p_sizes"]))
        head = f"tp={g['tp']} seq={g['seq']}: "
        within = f"within the model's error band ({g['band_factor']:.3f}x, q={b['q']:g})"
        if g.get("not_validated"):
            lines.append(head + f"not validated for {g['not_validated']}: measure them all "
                         f"({lays}) with:")
            lines.append("  " + g["settle_command"])
        elif g["confident"]:
            lines.append(head + f"confident pick {lays}: no other layout predicted {within} "
                         "of it")
        else:
            lines.append(head + f"too close to call: {lays} are predicted {within} of the "
                         "best; measure only them with:")
            lines.append("  " + g["settle_command"])
    if lines:
        lines.append(f"error band: {b['source']} (docs/predicted-band.md)")
    return lines


def packed_lines(pred: dict[str, Any]) -> list[str]:
    """Per packed (seq, tp) key: what its mix does to the attention (``costmodel.packed``),
    and whether the model was checked on packed data."""
    keys: dict[tuple[int, int], list[dict]] = {}
    for r in pred["candidates"]:
        if r.get("packed"):
            keys.setdefault((r["seq"], r["tp"]), []).append(r)
    out = []
    for (seq, tp), rows in keys.items():
        k = rows[0]["packed"]
        worst = max(rows, key=lambda r: r["packed"]["imbalance"])
        out.append(
            f"packed tp={tp} seq={seq} mix {k['mix']}, the {k['sequences']} sequence(s) a "
            f"trial runs: {k['docs_per_seq']:.1f} documents a sequence, attention work "
            f"{k['attention_fraction']:.1%} of one seq-long document, "
            f"2*cp padding +{k['padding_overhead']:.2%}, slowest a2a group "
            f"{worst['packed']['imbalance']:.3f}x the mean ([{worst['a2a']},{worst['p2p']}]); "
            + ("checked on packed rows by your calibration" if k["validated"] else
               f"these predictions are {k['note']}: the model and its band were checked on "
               "fixed-length keys only"))
    return out


def print_predict(pred: dict[str, Any]) -> None:
    """The cost model's table: every number PREDICTED, with the parameters' source. The
    default table holds the breakdown's five parts and fits TABLE_WIDTH columns; the terms
    inside each part (short blocks, few heads, messages, shared link, ring steps) are in
    ``format=json``."""
    from rich import box

    rows = pred["candidates"]
    table = Table(box=box.SIMPLE_HEAD, padding=0, pad_edge=False, show_lines=False)
    for col in ("#", "tp", "seq", "[a2a,p2p]", "step", "vs best", "compute", "a2a", "p2p",
                "other", "GiB", "fits", "note"):
        table.add_column(escape(col), overflow="fold",
                         max_width=18 if col == "note" else None,
                         justify="left" if col in ("[a2a,p2p]", "fits", "note") else "right")
    for r in rows:
        b = r["breakdown_s"]
        fits = "yes" if r["fits_memory"] else f"[red]no (> {pred['gpu_memory_gib']:g})[/]"
        table.add_row(
            str(r["rank"] or "-"), str(r["tp"]), str(r["seq"]),
            escape(f"[{r['a2a']},{r['p2p']}] {r['comm_type']}"),
            human_time(r["predicted_step_time_s"]), f"{r['vs_best']:.3f}x",
            human_time(b["compute_s"]), human_time(b["exposed_a2a_s"]),
            human_time(b["exposed_p2p_s"]), human_time(b["other_s"]),
            f"{r['predicted_memory_gib']:.1f}", fits,
            escape("; ".join(r["flags"] + _crossing(r))) or "-",
        )
    out = console()
    print_notes(pred)
    out.print(escape(
        f"PREDICTED (cost model, not measured): model={pred['model']} "
        f"cluster={pred['cluster']} cp={pred['cp']} pp={pred['pp']} mbs={pred['mbs']} "
        f"gbs={pred['gbs']} recompute={pred['recompute']} {pred['dtype']}; "
        f"params: {pred['params_source']}"))
    out.print("step = compute + exposed a2a + exposed p2p + other (per layer terms: "
              "format=json); GiB: predicted peak memory per GPU")
    out.print(table, width=TABLE_WIDTH)
    from hcp_tune.costmodel.memory import advice_line

    for a in pred.get("fit_advice", []):
        out.print(escape(advice_line(a, pred["gpu_memory_gib"], "predict")))
    for r in pred["rejected"]:
        out.print(escape(f"rejected tp={r['tp']} seq={r['seq']} [{r['a2a']},{r['p2p']}]: "
                         + "; ".join(r["reasons"])))
    say(*packed_lines(pred))
    say(*close_group_lines(pred))  # prose wrapped, a command whole
    out.print(escape(f"every number above is {pred['label']}; measure with "
                     "`python -m hcp_tune sweep ...` on the cluster"))
