"""Command-line entry: ``python -m hcp_tune <command> key=value ...`` (or ``hcp-tune``).

Each subcommand is a function taking its arguments and returning an exit code. A user's
mistake (``HcpError``) becomes one ``hcp-tune: error:`` line per problem and the error's
exit code; nothing is written and no traceback is shown. Torch is never imported here.
"""
from __future__ import annotations

import json
import sys
from typing import Callable

from hcp_tune.errors import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, ConfigError, HcpError

USAGE = """\
usage: python -m hcp_tune COMMAND [key=value ...]

commands:
  plan      list every [a2a,p2p] layout of the sweep, kept or rejected and why
            e.g. plan cp=8 seq=131072 model=llama3-8b cluster=dgx-h100
  validate  check a Bridge config against every HCP rule and print the fixes
            e.g. validate run_config.yaml model.cp_comm_type=a2a+p2p cluster=dgx-h100
  predict   predicted step time, memory and breakdown of every layout (cost model, no GPU)
            e.g. predict cp=8 seq=131072 model=llama3-8b cluster=dgx-h100

overrides use Hydra syntax: cp=16 seq=[65536,131072] tp=[1,2] cluster=dgx-h200
model=llama3-70b sweeps=PRESET format=json drop_cross_node_a2a=true
"""


def cmd_plan(args: list[str]) -> int:
    from hcp_tune import config, plan

    cfg = config.load(args)
    rows = plan.plan_rows(cfg)
    if cfg.format == "json":
        print(json.dumps(rows, indent=2))
    else:
        from hcp_tune import ui

        ui.print_plan(rows)
    return EXIT_OK


def cmd_predict(args: list[str]) -> int:
    from hcp_tune import config, predict

    cfg = config.load(args)
    rows = predict.predict_rows(cfg)
    if cfg.format == "json":
        print(json.dumps(rows, indent=2))
    else:
        from hcp_tune import ui

        ui.print_predict(rows)
    return EXIT_OK


VALIDATE_KEYS = ("config", "cluster", "model", "te_version", "format")


def cmd_validate(args: list[str]) -> int:
    from hcp_tune import validate

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
    findings = validate.check(tree, model=model, cluster=cluster, te_version=own.get("te_version"))
    source = files[0] if files else "overrides"
    if fmt == "json":
        print(json.dumps({"source": source, "findings": [vars(f) for f in findings]}, indent=2))
    else:
        from hcp_tune import ui

        ui.print_findings(findings, source)
    return EXIT_FINDINGS if any(f.severity == "error" for f in findings) else EXIT_OK


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "plan": cmd_plan,
    "validate": cmd_validate,
    "predict": cmd_predict,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return EXIT_OK if argv else EXIT_USAGE
    name, args = argv[0], argv[1:]
    command = COMMANDS.get(name)
    if command is None:
        from hcp_tune import ui

        ui.error_line(f"unknown command {name!r}; expected one of: {', '.join(COMMANDS)}")
        return EXIT_USAGE
    try:
        return command(args)
    except HcpError as exc:
        from hcp_tune import ui

        ui.error_line(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        print("hcp-tune: interrupted", file=sys.stderr)
        return 130
