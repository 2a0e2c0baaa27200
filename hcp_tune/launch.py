"""The old path of ``hcp_tune.engine.launch`` (``hcp_tune.launch.run_local`` is named in the
README and in users' scripts): importing it gives the moved module itself."""
import sys

from hcp_tune.engine import launch as _moved

sys.modules[__name__] = _moved
