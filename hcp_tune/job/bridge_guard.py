"""The old path of ``hcp_tune.job.bridge.guard`` (``hcp_tune.job.bridge_guard.HCPGuard`` is
named in users' Bridge scripts): importing it gives the moved module itself."""
import sys

from hcp_tune.job.bridge import guard as _moved

sys.modules[__name__] = _moved
