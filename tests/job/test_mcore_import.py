"""hcp_tune.job.mcore: a rank imports Megatron-Core's parallel_state alone, and the whole
package comes back when something needs it. Each check runs in a fresh interpreter (the
import state of this one is shared by every test)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("megatron.core")


def fresh(code: str) -> str:
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip()


def test_parallel_state_alone_leaves_the_packages_init_and_its_heavy_imports_out():
    out = fresh("""
        import sys
        from hcp_tune.job.mcore import parallel_state
        ps = parallel_state()
        print(ps.__name__, hasattr(ps, "initialize_model_parallel"),
              "megatron.core.tensor_parallel" in sys.modules,
              "megatron.core.distributed" in sys.modules,
              hasattr(sys.modules["megatron.core"], "ModelParallelConfig"),
              parallel_state() is ps)
    """)
    assert out == "megatron.core.parallel_state True False False False True"


def test_the_module_is_the_installed_file_and_the_package_completes_in_place():
    """The partial package is Megatron-Core's own (its spec, its files); completing it runs
    the __init__ once, keeps the parallel_state already imported (its globals: the groups a
    trial made) and gives the names a whole import gives."""
    out = fresh("""
        import importlib.util, sys
        from hcp_tune.job.mcore import complete_megatron_core, parallel_state
        ps = parallel_state()
        ps._HCP_MARK = 7
        same_file = ps.__file__ == importlib.util.find_spec("megatron.core.parallel_state").origin
        pkg = sys.modules["megatron.core"]
        complete_megatron_core()
        from megatron.core import ModelParallelConfig, parallel_state as again
        import megatron.core
        complete_megatron_core()  # a second call: nothing
        print(same_file, again is ps, again._HCP_MARK, megatron.core is pkg,
              ModelParallelConfig.__module__, "megatron.core.tensor_parallel" in sys.modules)
    """)
    assert out == ("True True 7 True megatron.core.model_parallel_config True")


def test_a_process_that_imported_megatron_core_whole_keeps_it():
    out = fresh("""
        import megatron.core, sys
        from hcp_tune.job.mcore import PARTIAL, complete_megatron_core, parallel_state
        ps = parallel_state()
        complete_megatron_core()
        print(ps is megatron.core.parallel_state, hasattr(megatron.core, PARTIAL))
    """)
    assert out == "True False"
