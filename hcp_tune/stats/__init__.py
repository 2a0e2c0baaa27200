"""The ranking's statistics, pure functions of stored rows: the figures and verdicts
(``verdict``: a layout's median with its interval, settled, tie, the trials still needed)
and the shared moderation of spreads (``shrinkage``), which regress uses too. The rule's
files (with ``engine.sweep_adaptive``, ``engine.trials`` and ``conf/search/default.yaml``)
were frozen before any held-out figure (benchmarks/frozen.py checks they still are).
"""
