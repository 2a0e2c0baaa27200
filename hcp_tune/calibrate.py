"""The old path of ``hcp_tune.costmodel.calibrate``, kept so that ``python -m hcp_tune.calibrate``
and ``import hcp_tune.calibrate`` still work: importing it gives the moved module itself."""
import sys

from hcp_tune.costmodel import calibrate as _moved

if __name__ == "__main__":
    sys.exit(_moved.main())
sys.modules[__name__] = _moved
