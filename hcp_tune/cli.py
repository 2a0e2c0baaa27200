"""Command-line entry: ``python -m hcp_tune <command> key=value ...`` (or ``hcp-tune``).

Each subcommand is a function taking its arguments and returning an exit code. A user's
mistake (``HcpError``) becomes one ``hcp-tune: error:`` line per problem and the error's
exit code; nothing is written and no traceback is shown. Torch is never imported here.
"""
from __future__ import annotations

import json
import sys
from typing import Callable

from hcp_tune.errors import (
    EXIT_FINDINGS,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    ConfigError,
    HcpError,
)

USAGE = """\
usage: python -m hcp_tune COMMAND [key=value ...]

commands:
  plan      list every [a2a,p2p] layout of the sweep, kept or rejected and why
            e.g. plan cp=8 seq=131072 model=llama3-8b cluster=dgx-h100
  validate  check a Bridge config against every HCP rule and print the fixes
            e.g. validate run_config.yaml model.cp_comm_type=a2a+p2p cluster=dgx-h100
  predict   predicted step time, memory and breakdown of every layout (cost model, no GPU)
            e.g. predict cp=8 seq=131072 model=llama3-8b cluster=dgx-h100
  sweep     measure every kept layout (SLURM or local), rank them, write results/
            e.g. sweep cp=4 seq=[2048,4096] model=tiny cluster=local executor=slurm
  recommend the best measured layout for one key, as Bridge overrides
            e.g. recommend cluster=local model=tiny cp=4 seq=2048
            with no key: every key measured on a cluster, one line each
            e.g. recommend cluster=local [model=tiny] [env_tag=T] [format=csv|json|md]
  trial     run one layout once on this machine and print its result
            e.g. trial cp=4 seq=2048 model=tiny cluster=local a2a=2
  regress   compare two env tags' stored trials (ratios, intervals, verdicts; exit 1 a
            confirmed change, 4 inconclusive: measure more, or settle=true does it)
            e.g. regress baseline=te-2.9 candidate=te-2.10 results_dir=results
  report    an HTML page of a sweep's results (time vs memory, Pareto front, spreads)
            e.g. report results_dir=results env_tag=te-2.9
  results   what a results folder holds: per env tag its keys, trials and size
            e.g. results results_dir=results [format=json]
            results drop|archive env_tag=TAG [results_dir=results]: remove a tag
            results sync|migrate search.storage=postgresql://... : a team's database

overrides use Hydra syntax: cp=16 seq=[65536,131072] tp=[1,2] cluster=dgx-h200
model=llama3-70b sweeps=PRESET format=json drop_cross_node_a2a=true
"""


def _show(fmt: str, data: dict, table: str, view: str = "ui") -> None:
    """``format=json`` prints ``data``; otherwise ``outputs.<view>.<table>`` renders it."""
    if fmt == "json":
        print(json.dumps(data, indent=2, default=str))
        return
    import importlib

    getattr(importlib.import_module(f"hcp_tune.outputs.{view}"), table)(data)


def cmd_plan(args: list[str]) -> int:
    from hcp_tune import config
    from hcp_tune.engine import sweep_plan

    cfg = config.load(args)
    _show(cfg.format, sweep_plan.plan_rows(cfg), "print_plan")
    return EXIT_OK


def cmd_predict(args: list[str]) -> int:
    from hcp_tune import config
    from hcp_tune.costmodel import predict

    cfg = config.load(args)
    pred = predict.predict_rows(cfg)
    pred["measured"] = _measured_first(cfg, pred)
    if cfg.format != "json":
        from hcp_tune.outputs.ui import say

        say(*pred["measured"])
    _show(cfg.format, pred, "print_predict", "predict_view")
    return EXIT_OK


def _measured_first(cfg, pred: dict) -> list[str]:
    """What the results folder measured for the predicted keys, one line a key, and where
    it contradicts the prediction (a settled measured best the model ranks elsewhere)."""
    from hcp_tune.store.folder import ResultStore
    from hcp_tune.outputs import recommend

    lines = []
    for g in pred["close_groups"]:
        want = {"cluster": cfg.cluster.name, "model": cfg.model.name, "tp": g["tp"],
                "pp": cfg.pp, "cp": cfg.cp, "seq": g["seq"], "dp": cfg.dp, "mbs": cfg.mbs,
                "mix": _mix_label(cfg, g["seq"])}
        found = recommend.find(ResultStore(cfg.results_dir).recommendations(), want)
        if not found:
            continue
        rec = found[0]
        best = int(rec["a2a"])
        ranked = [r["a2a"] for r in pred["candidates"]
                  if (r["seq"], r["tp"]) == (g["seq"], g["tp"]) and r["fits_memory"]]
        lines.append(f"MEASURED tp={g['tp']} seq={g['seq']} ({cfg.results_dir}): "
                     f"[{rec['a2a']},{rec['p2p']}] {recommend.figure_text(rec)}, "
                     f"{rec.get('verdict') or 'no verdict'}")
        if rec.get("verdict") == "settled" and ranked and ranked[0] != best:
            lines.append(f"  the prediction below CONTRADICTS it: the model ranks "
                         f"[{ranked[0]},{cfg.cp // ranked[0]}] first; trust the measurement")
    return lines


VALIDATE_KEYS = ("config", "cluster", "model", "te_version", "pad_between_seqs", "format")


def cmd_validate(args: list[str]) -> int:
    from hcp_tune.space import validate

    files, bridge, own = [], [], {}
    for arg in args:
        if validate.is_bridge_override(arg):
            bridge.append(arg)
        elif "=" not in arg:
            files.append(arg)
        else:
            key, _, value = arg.partition("=")
            if key not in VALIDATE_KEYS:
                raise ConfigError(
                    f"{arg}: validate takes a config file, Bridge overrides "
                    f"(model.KEY=VALUE, dist.KEY=VALUE, ...) and {', '.join(VALIDATE_KEYS)}"
                )
            if key == "config":
                files.append(value)
            else:
                own[key] = value
    if len(files) > 1:
        raise ConfigError(f"validate takes one config file, got {len(files)}: {' '.join(files)}")
    if not files and not bridge:
        raise ConfigError(
            "validate needs a Bridge config YAML and/or overrides such as "
            "model.context_parallel_size=8 model.cp_comm_type=a2a+p2p"
        )
    fmt = own.pop("format", "table")
    if fmt not in ("table", "json"):
        raise ConfigError(f"format={fmt!r}: expected one of table, json")
    tree = validate.read_config_file(files[0]) if files else {}
    tree = validate.apply_overrides(tree, bridge)
    cluster = model = None
    if "cluster" in own or "model" in own:
        from hcp_tune import config

        loaded = config.load([f"{k}={own[k]}" for k in ("cluster", "model") if k in own])
        cluster = loaded.cluster if "cluster" in own else None
        model = loaded.model if "model" in own else None
    findings = validate.check(tree, model=model, cluster=cluster, te_version=own.get("te_version"),
                              pad_between_seqs=own.get("pad_between_seqs"))
    source = files[0] if files else "overrides"
    if fmt == "json":
        print(json.dumps({"source": source, "findings": [vars(f) for f in findings]}, indent=2))
    else:
        from hcp_tune.outputs import ui

        ui.print_findings(findings, source)
    return EXIT_FINDINGS if any(f.severity == "error" for f in findings) else EXIT_OK


def cmd_sweep(args: list[str]) -> int:
    import dataclasses

    from hcp_tune import config
    from hcp_tune.costmodel import predict
    from hcp_tune.engine.runner_choice import sweep_runner
    from hcp_tune.outputs import ui

    cfg = config.load(args)
    runner, reason = sweep_runner(cfg)  # runner=auto decided, SLURM asked: nothing written
    if runner == "synthetic":  # a bad truth file: one line, before anything is written
        from hcp_tune.engine import synthetic

        synthetic.check_sweep(cfg)
    if runner != "model":  # it will write there: say so now, not after a job ran
        from hcp_tune.store import rdb

        rdb.check(cfg.search.storage)  # a database that refuses us: one line, nothing written
        config.writable_dir(cfg.results_dir)
    ui.print_sweep_runner(reason)
    if runner == "model":
        _show(cfg.format, predict.predict_rows(cfg), "print_predict", "predict_view")
        return EXIT_OK
    cfg = dataclasses.replace(cfg, runner=dataclasses.replace(cfg.runner, name=runner))
    if runner == "attention+bridge":  # attention over every layout, Bridge over the best k
        from hcp_tune.engine import twostage

        summary = twostage.run(cfg, ui.SweepReporter(), on_plan=ui.print_sweep_start,
                                on_table=ui.print_two_stage)
    else:
        from hcp_tune.engine import sweep

        sweeper = sweep.Sweeper(cfg, ui.SweepReporter())
        ui.print_sweep_start(sweeper.plan())
        summary = sweeper.run()
    recs = _own_recommendations(summary)
    ui.print_sweep_end(summary, recs, cfg.results_dir)
    return EXIT_FINDINGS if summary.aborted or not recs else EXIT_OK


def _own_recommendations(summary) -> list[dict]:
    """The recommendations of this sweep's keys, selected by the keys' fields."""
    return [r for r in summary.recommendations if any(k.holds(r) for k in summary.keys)]


def cmd_trial(args: list[str]) -> int:
    """Run one layout once on this machine (local processes) and print its result."""
    import dataclasses

    from hcp_tune import config
    from hcp_tune.config.schema import as_int
    from hcp_tune.engine.runner_choice import resolve_runner
    from hcp_tune.space import plan

    a2a_args = [a for a in args if a.startswith("a2a=")]
    if len(a2a_args) != 1:
        raise ConfigError("trial needs the layout's a2a size: a2a=N (p2p = cp / N)")
    a2a = as_int(a2a_args[0].split("=", 1)[1], "a2a")
    cfg = config.load([a for a in args if not a.startswith("a2a=")])
    if len(cfg.seqs) != 1 or len(cfg.tps) != 1:
        raise ConfigError("trial runs one layout: give one seq and one tp value")
    runner, _ = resolve_runner(cfg.runner.name, command="trial")
    cfg = dataclasses.replace(cfg, runner=dataclasses.replace(cfg.runner, name=runner))
    cands = {c.layout.a2a: c for c in plan.candidates(cfg)}
    if a2a not in cands:
        raise ConfigError(f"a2a={a2a}: must divide cp={cfg.cp}; choices: {sorted(cands)}")
    cand = cands[a2a]
    if not cand.kept:
        raise ConfigError(f"a2a={a2a}: layout {cand.layout.label} is rejected: {cand.reasons[0]}")
    config.writable_dir(cfg.results_dir)
    from hcp_tune.engine.launch import run_local
    from hcp_tune.engine.trialspec import spec_for
    from hcp_tune.spec import to_json

    workdir = cfg.results_dir / "trials" / f"manual-{cand.layout.a2a}x{cand.layout.p2p}-s{cand.seq}"
    spec = spec_for(cfg, cand, workdir.name, workdir)
    print(f"trial: {cand.layout.label} {cand.layout.comm_type} tp={cand.tp} seq={cand.seq} on "
          f"{spec.world_size} local process(es) (the local executor's job, as a sweep runs "
          f"it); logs in {workdir}/jobs/", file=sys.stderr)
    result = run_local(spec, workdir=workdir, executor=cfg.executor)
    print(json.dumps(json.loads(to_json(result)), indent=2))
    return EXIT_OK if result.status.value == "ok" else EXIT_FINDINGS


def _mix_label(cfg, seq: int) -> str:
    """The key's mix field at ``seq``: the length mix's label, "" with one document a sequence."""
    mix = cfg.mix_at(seq)
    return mix.label if mix else ""


def cmd_recommend(args: list[str]) -> int:
    from hcp_tune import config
    from hcp_tune.store.folder import ResultStore
    from hcp_tune.outputs import cluster_table, recommend

    if cluster_table.is_listing(args):  # no key asked: every key of the cluster
        return cluster_table.cmd_listing(args)
    cfg = config.load(args)
    if len(cfg.seqs) != 1 or len(cfg.tps) != 1:
        raise ConfigError("recommend answers one key: give one seq and one tp value")
    given = {a.split("=", 1)[0] for a in args}
    want = {"cluster": cfg.cluster.name, "model": cfg.model.name, "tp": cfg.tps[0],
            "pp": cfg.pp, "cp": cfg.cp, "seq": cfg.seqs[0], "dp": cfg.dp, "mbs": cfg.mbs,
            # m only when the user gave gbs: the attention runner's keys have m = 1
            "micro_batches": cfg.micro_batches if "gbs" in given else None,
            "env_tag": cfg.env_tag if "env_tag" in given else None,
            "mix": _mix_label(cfg, cfg.seqs[0])}  # packed and fixed-length keys never mix
    store = ResultStore(cfg.results_dir, cfg.search.storage)
    store.refresh()  # a view of a team's database (search.storage, or the folder's): synced
    recs = store.recommendations()
    rec, near = recommend.answer(recs, want)
    tags = sorted({str(r["env_tag"]) for r in recommend.find(recs, {**want, "env_tag": None})})
    if rec and want["env_tag"] is None and len(tags) > 1:
        print(f"recommend: read env_tag={rec['env_tag']} (the most measured); this key was "
              f"measured under {', '.join(tags)}: env_tag=NAME picks one", file=sys.stderr)
    if rec:  # a row measured with HCP_TUNE_INJECT_DELAY is a test, never a recommendation
        from hcp_tune.store.folder import SweepKey
        from hcp_tune.outputs.regress import injected_warnings

        rows = store.key_rows(SweepKey.of(rec))
        for line in injected_warnings(rows):
            print(f"recommend: warning: {line}", file=sys.stderr)
    from hcp_tune.costmodel import predict

    pred = predict.predict_rows(cfg)
    unfit = recommend.unfit_reason(rec, pred["candidates"], cfg.cluster.gpu_memory_gib) \
        if rec else None
    if unfit:  # the measured best would run out of memory in training: never recommended
        print(f"recommend: not recommending {unfit}", file=sys.stderr)
        rec = None
    predicted = None
    advice = pred["fit_advice"]
    if rec is None:
        ranked = [r for r in pred["candidates"] if r["fits_memory"]]
        predicted = ranked[0] if ranked else None
    if cfg.format == "json":
        print(json.dumps({
            "found": rec is not None, "recommendation": rec,
            "bridge_overrides": recommend.bridge_overrides(rec) if rec else None,
            "python": recommend.python_form(rec) if rec else None,
            "nearest_measured": near,
            "prediction": predicted,
            "band": pred["band"] if predicted else None,
            "close_group": next((g for g in pred["close_groups"]), None) if predicted else None,
            "fit_advice": advice,
        }, indent=2, default=str))
    elif rec:
        from hcp_tune.config import results_dir_override
        from hcp_tune.outputs import ui

        ui.print_recommendation(rec, recommend.bridge_overrides(rec), recommend.python_form(rec),
                                results_dir_override(cfg))
    else:
        from hcp_tune.costmodel.memory import advice_line
        from hcp_tune.outputs.predict_view import close_group_lines
        from hcp_tune.outputs.ui import say

        say(f"recommend: nothing measured for "
            f"{recommend.key_text({**want, 'env_tag': want['env_tag'] or 'any'})}"
            f" in {cfg.results_dir}/recommendations.csv")
        if near:
            say("nearest measured keys:",
                *(f"  {recommend.key_text(r)} -> [{r['a2a']},{r['p2p']}]" for r in near))
        elif not cfg.results_dir.is_dir():
            say(f"recommend: {config.no_such_folder(cfg.results_dir)}")
        else:
            say("nothing has been measured there yet: run `python -m hcp_tune sweep ...` first")
        if predicted:
            say("", f"PREDICTED, not measured ({predicted['label']}): "
                f"[{predicted['a2a']},{predicted['p2p']}] {predicted['comm_type']}, "
                f"{predicted['predicted_step_time_s']:.4g} s per step",
                "  " + " ".join(predicted["bridge_overrides"]), *close_group_lines(pred))
        say(*(advice_line(a, cfg.cluster.gpu_memory_gib, "recommend") for a in advice))
    return EXIT_OK if rec else EXIT_NOT_FOUND


def cmd_regress(args: list[str]) -> int:
    # imported here, not at the top: every other command (recommend's second) skips it
    from hcp_tune.outputs.regress.cli import cmd_regress as regress

    return regress(args)


def cmd_report(args: list[str]) -> int:
    from hcp_tune.outputs.regress.cli import cmd_report as report

    return report(args)


def cmd_results(args: list[str]) -> int:
    from hcp_tune.outputs.folder import cmd_results as results

    return results(args)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "plan": cmd_plan,
    "validate": cmd_validate,
    "sweep": cmd_sweep,
    "recommend": cmd_recommend,
    "trial": cmd_trial,
    "predict": cmd_predict,
    "regress": cmd_regress,
    "report": cmd_report,
    "results": cmd_results,
}


HELP = ("-h", "--help", "help")


def usage_of(name: str) -> str:
    """The usage of one command: its lines of ``USAGE`` (every line from ``  NAME `` to
    the next command, subcommands such as ``results drop`` included) and the overrides'
    syntax. A command added to ``COMMANDS`` and ``USAGE`` gets ``--help`` with no more."""
    lines = USAGE.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(f"  {name} ")), None)
    if start is None:
        return USAGE
    end = start + 1
    while end < len(lines) and lines[end].startswith("   "):
        end += 1
    footer = lines[next((i for i, ln in enumerate(lines) if ln.startswith("overrides ")),
                        len(lines)):]
    return "\n".join([f"usage: python -m hcp_tune {name} [key=value ...]", "",
                      *lines[start:end], "", *footer])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in HELP:
        print(USAGE)
        return EXIT_OK if argv else EXIT_USAGE
    name, args = argv[0], argv[1:]
    command = COMMANDS.get(name)
    if command is None:
        from hcp_tune.outputs import ui

        ui.error_line(f"unknown command {name!r}; expected one of: {', '.join(COMMANDS)}")
        return EXIT_USAGE
    if any(a in HELP[:2] for a in args) or args[:1] == ["help"]:  # before any loading
        print(usage_of(name))
        return EXIT_OK
    try:
        return command(args)
    except HcpError as exc:
        from hcp_tune.outputs import ui

        ui.error_line(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        print("hcp-tune: interrupted", file=sys.stderr)
        return 130
