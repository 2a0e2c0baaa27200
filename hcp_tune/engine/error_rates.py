"""What the benchmarks measured of each verdict, through the real sweep loop
(runner=synthetic) on regimes and seeds held out from building the rule (frozen at
ace6239): the figures every printed verdict states. One row per noise regime in
benchmarks/RESULTS-decision-cost.md (log-normal 1-3%, Student-t(3) tails, bimodal, a 5%
layout beside 1% ones as the best and as a rival, drift, layouts within 2-4%, exactly
equal ones, a per-layout session effect); a verdict prints the worst regime's rate, and
docs/guides/ranking.md lists every regime's. ``tests/stats/test_verdict.py`` fails when
a RESULTS file moves without these."""

# the worst held-out regime's rate of each verdict kind being wrong, of keys
SETTLED_WORST = "2.2% [1.2%, 4.2%]"
SETTLED_WORST_REGIME = "two equal best, log-normal 2%"
TIE_WORST = "0.2% [0.0%, 1.4%]"
# a settled pick against the long-run truth when each layout meets each session in its own
# way (a per-layout session effect of N(0, 2%)): what a verdict carries to another session
SETTLED_OTHER_SESSION = "2.0% [1.0%, 3.9%]"
# adaptive's trials over the exhaustive sweep's (4 layouts x search.repeats=5)
ADAPTIVE_COST = ("29-32% of the exhaustive sweep's trials on clear keys (layouts >= 10% "
                 "apart), 57-70% on close ones")
POWER_RULE = ("settled or a tie in {power} of held-out unsettled keys measured with the "
              "printed command: benchmarks/RESULTS-power-rule.md")
POWER_FIGURE = "73.9% [68.9%, 78.4%]"  # RESULTS-power-rule.md's "All rows"

SETTLED_ERROR = (f"a settled pick was wrong in at most {SETTLED_WORST} of keys in every noise "
                 f"regime measured (worst: {SETTLED_WORST_REGIME}); in another session, with "
                 f"a per-layout session effect of 2%, in {SETTLED_OTHER_SESSION}: "
                 "docs/guides/ranking.md")
AGREEMENT = (f"a tie was wrong in at most {TIE_WORST} of keys in every noise regime "
             "measured: docs/guides/ranking.md")


def rate_for(kind: str) -> str:
    """What was measured of a verdict of this kind (settled | tie | unsettled): the figure
    printed beside it."""
    return {"settled": SETTLED_ERROR, "tie": AGREEMENT,
            "unsettled": POWER_RULE.format(power=POWER_FIGURE)}.get(kind, "")
