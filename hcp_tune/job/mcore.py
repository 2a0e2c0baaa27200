"""How the job side imports Megatron-Core: its ``parallel_state`` module alone, where
nothing in the process has imported the package yet.

A trial of the attention runner needs only ``parallel_state`` (the groups it builds with
``initialize_model_parallel``). ``import megatron.core.parallel_state`` first runs the
package's ``__init__``, which imports its tensor-parallel layers, DDP, optimizer and the
Transformer Engine extension: 3.3 s a process on this project's 2-core CI machine, of
which ``parallel_state`` and what it imports take 1.0 s. Every rank of every process set
pays that, so ``parallel_state()`` registers the package from its own spec without running
``__init__`` and imports the one module through it; the module is the same code, read from
the same files. Whatever needs the whole package (Bridge, which imports Megatron-Core's
models) calls ``complete_megatron_core()`` first, which runs the ``__init__`` in place.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

PARTIAL = "_hcp_tune_partial"  # set on a megatron.core registered without its __init__


def parallel_state() -> Any:
    """``megatron.core.parallel_state``, importing nothing else of Megatron-Core that the
    process does not have already."""
    done = sys.modules.get("megatron.core.parallel_state")
    if done is not None:
        return done
    if "megatron.core" not in sys.modules:
        spec = importlib.util.find_spec("megatron.core")  # imports the parent, megatron
        if spec is not None and spec.loader is not None and spec.submodule_search_locations:
            package = importlib.util.module_from_spec(spec)
            setattr(package, PARTIAL, True)
            sys.modules["megatron.core"] = package
            setattr(sys.modules["megatron"], "core", package)
    return importlib.import_module("megatron.core.parallel_state")


def complete_megatron_core() -> None:
    """Run ``megatron.core``'s ``__init__`` if ``parallel_state()`` registered the package
    without it (a no-op otherwise): after this, ``from megatron.core import X`` works as in
    any process. Modules already imported are kept (the ``__init__`` imports them again,
    from ``sys.modules``)."""
    package = sys.modules.get("megatron.core")
    if package is not None and package.__dict__.pop(PARTIAL, False):
        try:
            package.__spec__.loader.exec_module(package)
        except BaseException:
            setattr(package, PARTIAL, True)  # still partial: a later call tries again
            raise
