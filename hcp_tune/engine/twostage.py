"""``sweep runner=attention+bridge``: cheap first, real last.

Stage 1 runs the attention runner over every kept layout (an ordinary ``Sweeper``, its
rows stored under runner=attention keys). Stage 2 runs Bridge on the best ``runner.top_k``
layouts of each (tp, seq) key by the attention stage's ranking (a ``Sweeper`` whose queue
is cut to those layouts, rows under runner=bridge keys). The recommendation is Bridge's;
``<results_dir>/two_stage.csv`` has one line per key saying which layout each stage
ranked first and whether they agree, so users learn when the cheap runner can be trusted.

Built on the existing Sweeper (resume, early stopping, the environment stop all hold per
stage); nothing here changes how a stage runs. When stage 1 ranks nothing for a key (all
failed or invalid), stage 2 measures nothing for it and the line says so.
"""
from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path
from typing import Any, Callable, Optional

from hcp_tune.config import SweepConfig
from hcp_tune.store import folder as store_mod
from hcp_tune.engine import sweep_plan
from hcp_tune.engine.sweep import Sweeper, SweepSummary, runs_as_steps
from hcp_tune.engine.sweep_plan import SweepPlan
from hcp_tune.spec import atomic_write_text

TWO_STAGE_FIELDS = ("cluster", "model", "tp", "cp", "seq", "env_tag", "attention_best",
                    "attention_median_s", "bridge_candidates", "bridge_best",
                    "bridge_median_s", "matched", "note")


def stage_config(cfg: SweepConfig, runner: str) -> SweepConfig:
    return dataclasses.replace(cfg, runner=dataclasses.replace(cfg.runner, name=runner))


def _key_rows(rows: list[dict[str, Any]], cfg: SweepConfig, runner: str, tp: int, seq: int
              ) -> list[dict[str, Any]]:
    """The rows of one stage's key (``runner``) at (tp, seq)."""
    return store_mod.key_rows(rows, sweep_plan.key_at(cfg, tp, seq, runner))


def best_layouts(rows: list[dict[str, Any]], cfg: SweepConfig, k: int
                 ) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """Per (tp, seq): the attention stage's k fastest verified layouts (store.rank)."""
    return {(tp, seq): store_mod.rank(_key_rows(rows, cfg, "attention", tp, seq))[:k]
            for tp in cfg.tps for seq in cfg.seqs}


class BridgeStage(Sweeper):
    """A Sweeper that measures only the chosen layouts of each key (the plan's ``only``)."""

    def __init__(self, cfg: SweepConfig, reporter: Any,
                 chosen: dict[tuple[int, int], set[int]]) -> None:
        super().__init__(cfg, reporter, only=chosen)
        self.chosen = chosen  # (tp, seq) -> a2a sizes to measure


def compare(rows: list[dict[str, Any]], cfg: SweepConfig,
            picked: dict[tuple[int, int], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One line per key: each stage's winner and whether they agree."""
    out = []
    for (tp, seq), top in sorted(picked.items()):
        bridge = store_mod.rank(_key_rows(rows, cfg, "bridge", tp, seq))
        a_best: Optional[dict[str, Any]] = top[0] if top else None
        b_best: Optional[dict[str, Any]] = bridge[0] if bridge else None
        label = (lambda r: f"[{r['a2a']},{r['p2p']}]" if r else "")
        note = ("" if a_best and b_best else
                "attention stage ranked nothing" if not a_best else
                "Bridge stage ranked nothing (see its failed/invalid rows)")
        out.append({
            "cluster": cfg.cluster.name, "model": cfg.model.name, "tp": tp, "cp": cfg.cp,
            "seq": seq, "env_tag": cfg.env_tag, "attention_best": label(a_best),
            "attention_median_s": a_best["median_s"] if a_best else None,
            "bridge_candidates": " ".join(label(r) for r in top),
            "bridge_best": label(b_best), "bridge_median_s": b_best["median_s"] if b_best else None,
            "matched": (a_best["a2a"] == b_best["a2a"]) if a_best and b_best else None,
            "note": note,
        })
    return out


def write_table(path, lines: list[dict[str, Any]]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=TWO_STAGE_FIELDS)
    w.writeheader()
    w.writerows(lines)
    atomic_write_text(str(path), buf.getvalue())


def run(cfg: SweepConfig, reporter: Any, *,
        on_plan: Optional[Callable[[SweepPlan], None]] = None,
        on_table: Optional[Callable[[list[dict[str, Any]], Path], None]] = None) -> SweepSummary:
    """Both stages; the summary's recommendations are Bridge's, each with ``matched``.
    ``on_plan`` sees the attention stage's plan before anything is submitted; ``on_table``
    the two stages' winners per key once ``two_stage.csv`` is written (the CLI prints them)."""
    runs_as_steps(stage_config(cfg, "bridge"))  # refused before the first stage, not after
    stage = Sweeper(stage_config(cfg, "attention"), reporter)
    plan = stage.plan()
    if on_plan is not None:
        on_plan(plan)
    first = stage.run()
    if first.aborted:
        first.aborted = f"attention stage: {first.aborted}"
        return first
    picked = best_layouts(store_mod.ResultStore(cfg.results_dir).rows(), cfg, cfg.runner.top_k)
    chosen = {key: {r["a2a"] for r in top} for key, top in picked.items()}
    second = BridgeStage(stage_config(cfg, "bridge"), reporter, chosen).run()
    rows = store_mod.ResultStore(cfg.results_dir).rows()
    lines = compare(rows, cfg, picked)
    write_table(cfg.results_dir / "two_stage.csv", lines)
    if on_table is not None:
        on_table(lines, cfg.results_dir / "two_stage.csv")
    matched = {(ln["tp"], ln["seq"]): ln["matched"] for ln in lines}
    second.recommendations = [
        {**r, "attention_winner_matched": matched.get((r["tp"], r["seq"]))}
        for r in second.recommendations if r.get("runner") == "bridge"]
    second.stored += first.stored
    for status, n in first.by_status.items():
        second.by_status[status] = second.by_status.get(status, 0) + n
    second.pruned += first.pruned
    second.pruned_saved_steps += first.pruned_saved_steps
    if second.aborted:
        second.aborted = f"Bridge stage: {second.aborted}"
    return second
