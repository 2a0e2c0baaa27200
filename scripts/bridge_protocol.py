"""Write what Megatron-Bridge's ``pretrain`` does around its callbacks, read from the pinned
source, as JSON test data for the test double (tests/job/bridge/pretrain_double.py).

Reads ``git show REV:PATH`` from a Bridge checkout (not an installed Bridge: it cannot be
imported without Transformer Engine) and parses with ``ast``:

- ``CallbackContext``'s fields (``training/callbacks.py``);
- ``forward_step``'s parameters (``training/gpt_step.py``);
- in ``training/train.py``'s ``train``: the loop's condition and what ``train_config`` is,
  and, in source order, every ``callback_manager.fire(EVENT, CallbackContext(...))`` with
  the context fields it passes, the call of the train step, the step counter's and the
  FLOP counter's increments, and ``sys.exit``; each marked inside or after the loop.

The double builds its contexts with exactly these fields and fires the events in this
order, so it cannot repeat a misreading of the runner's own. Usage::

    python scripts/bridge_protocol.py BRIDGE_GIT > tests/data/bridge_protocol.json
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys

BRIDGE_REV = "51885cf132b2814188b6855c25a8588254274c2a"  # Megatron-Bridge tag v0.6.0
SRC = "src/megatron/bridge/training/"


def _source(repo: str, path: str) -> ast.Module:
    text = subprocess.run(["git", "-C", repo, "show", f"{BRIDGE_REV}:{SRC}{path}"],
                          check=True, capture_output=True, text=True).stdout
    return ast.parse(text)


def _named(tree: ast.Module, kind: type, name: str):
    return next(n for n in ast.walk(tree) if isinstance(n, kind) and n.name == name)


def _dataclass_fields(cls: ast.ClassDef) -> list[str]:
    return [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign)
            and isinstance(s.target, ast.Name)]


def _events(fn: ast.FunctionDef) -> list[dict]:
    loop = next(n for n in fn.body if isinstance(n, ast.While))
    inside = {id(n) for n in ast.walk(loop)}
    out = []
    for node in sorted(ast.walk(fn), key=lambda n: (getattr(n, "lineno", 0),
                                                     getattr(n, "col_offset", 0))):
        where = "loop" if id(node) in inside else ("before" if getattr(node, "lineno", 0)
                                                   < loop.lineno else "after")
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "callback_manager.fire":
            ctx = node.args[1]
            out.append({"fire": node.args[0].value, "where": where,
                        "context": [k.arg for k in ctx.keywords]})
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "wrapped_train_step":
            out.append({"call": "train_step", "where": where})
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.exit":
            out.append({"call": "sys.exit", "where": where})
        elif isinstance(node, ast.AugAssign) and ast.unparse(node.target) in (
                "global_state.train_state.step",
                "global_state.train_state.floating_point_operations_so_far"):
            out.append({"increment": ast.unparse(node.target).split(".")[-1], "where": where})
    return out


def main(repo: str) -> dict:
    cb = _source(repo, "callbacks.py")
    step = _source(repo, "gpt_step.py")
    train = _source(repo, "train.py")
    fn = _named(train, ast.FunctionDef, "train")
    loop = next(n for n in fn.body if isinstance(n, ast.While))
    train_config = next(ast.unparse(s.value) for s in fn.body if isinstance(s, ast.Assign)
                        and ast.unparse(s.targets[0]) == "train_config")
    fwd = _named(step, ast.FunctionDef, "forward_step")
    return {
        "bridge": f"Megatron-Bridge v0.6.0 {BRIDGE_REV}",
        "context_fields": _dataclass_fields(_named(cb, ast.ClassDef, "CallbackContext")),
        "forward_step_params": [a.arg for a in fwd.args.args],
        "loop_condition": ast.unparse(loop.test),
        "train_config": train_config,
        "train": _events(fn),
    }


if __name__ == "__main__":
    json.dump(main(sys.argv[1]), sys.stdout, indent=1)
    sys.stdout.write("\n")
