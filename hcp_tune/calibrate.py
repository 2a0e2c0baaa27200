"""``python -m hcp_tune.calibrate ROWS.json [results_dir=...]``: the calibration command as
the docs give it (docs/guides/cost-model.md, docs/predicted-band.md); the code is
``hcp_tune.costmodel.calibrate``, which ``import hcp_tune.calibrate`` also gives. Kept as a
command users type, not as an old import path (issue 39 removed those: ``hcp_tune.launch``
and ``hcp_tune.job.bridge_guard``)."""
import sys

from hcp_tune.costmodel import calibrate as _moved

if __name__ == "__main__":
    sys.exit(_moved.main())
sys.modules[__name__] = _moved
