"""What ``benchmarks/decision_cost.py`` measured of the verdicts and of adaptive measuring,
on the keys held out from choosing the defaults, layouts in candidate order (no help from
the prediction: the worse case), and what ``benchmarks/power_rule.py`` measured of the
"N more trials" suggestion. The figures every printed verdict and estimate states;
``tests/engine/test_verdict.py`` fails when benchmarks/RESULTS-decision-cost.md or
RESULTS-power-rule.md moves without them. docs/guides/ranking.md explains the design."""

SETTLED_ERROR = ("a settled pick was not the fastest in 3.2% [2.4%, 4.3%] of settled verdicts "
                 "on held-out keys of the decision-cost benchmark; on a loaded shared CPU "
                 "machine, whose sessions differ, in 18.5% [11.9%, 27.6%]: "
                 "docs/guides/ranking.md")
AGREEMENT = ("a declared tie was wrong in 0.0% [0.0%, 12.9%] of held-out ties; the winner or "
             "a tie holding it matched the exhaustive sweep in 96.7% [95.7%, 97.4%] of keys")
ADAPTIVE_COST = "40.3%"  # adaptive's trials over the exhaustive sweep's (search.repeats each)
POWER_RULE = ("settled or a tie in 91.2% [90.4%, 92.0%] of simulated unsettled keys measured "
              "up to the suggested count: benchmarks/RESULTS-power-rule.md")


def rate_for(kind: str) -> str:
    """What was measured of a verdict of this kind (settled | tie | unsettled): the figure
    printed beside it."""
    return {"settled": SETTLED_ERROR, "tie": AGREEMENT, "unsettled": POWER_RULE}.get(kind, "")
