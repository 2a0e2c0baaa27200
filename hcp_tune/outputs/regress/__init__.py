"""``regress``: compare what two environment tags measured, and say what changed.

- ``rows``: what a stored row contributes (its key, whether it counts, its memory reading)
- ``stats``: the statistics (common shift, per-layout deviations, Holm, power, spending)
- ``model``: rows -> a ``Comparison`` with every verdict
- ``settle``: the sweeps that settle an inconclusive layout (group-sequential looks)
- ``view``: the terminal table and the Markdown file; ``cli``: the commands

The names other modules use are re-exported here.
"""
from hcp_tune.outputs.regress.model import (
    COMPARED,
    MAX_TRIALS,
    MIN_TRIALS,
    Comparison,
    KeyComparison,
    LayoutComparison,
    Options,
    compare,
)
from hcp_tune.outputs.regress.rows import (
    RegressError,
    fingerprint_of,
    injected_warnings,
    key_text,
    row_key,
    usable,
)

__all__ = ["COMPARED", "MAX_TRIALS", "MIN_TRIALS", "Comparison", "KeyComparison",
           "LayoutComparison", "Options", "RegressError", "compare", "fingerprint_of",
           "injected_warnings", "key_text", "row_key", "usable"]
