"""What ``benchmarks/regress_error_rates.py`` measured of ``regress``'s verdicts, regime by
regime (``benchmarks/RESULTS-regress-error-rates.md``, part 1: 400 nights of 48 layouts a
regime, the rule frozen first, seeds never used while it was built): the figures a
summary states beside its verdicts, the worst of the regimes of its design.
``tests/outputs/test_regress_rates.py`` fails when the results file moves without them;
docs/regress.md lists every regime. Standard library only.
"""
from __future__ import annotations

# One session per tag, the rule told the sessions' real spread (S, L): the A/A regimes'
# nights with a confirmed change, as the results file writes them
SESSIONS_AA = {
    "A/A, fixed 3% shift, sigma 3%, 5 trials": "1.8% [0.9%, 3.6%]",
    "A/A, sigma 2%, 10 trials": "0.0% [0.0%, 1.0%]",
    "A/A, t3 tails, sigma 2%, 10 trials": "0.0% [0.0%, 1.0%]",
    "A/A, bimodal (30% of trials 6% slow), sigma 1%, 10 trials": "0.5% [0.1%, 1.8%]",
    "A/A, sessions N(0,1%) and N(0,0.5%) given, sigma 2%, 10 trials": "0.0% [0.0%, 1.0%]",
    "A/A, sessions N(0,1%) and N(0,1%) given, sigma 2%, 10 trials": "1.8% [0.9%, 3.6%]",
    "A/A, sessions N(0,2%) and N(0,0.5%) given, sigma 2%, 10 trials": "0.2% [0.0%, 1.4%]",
    "A/A, sessions N(0,2%) and N(0,1%) given, sigma 2%, 10 trials": "2.2% [1.2%, 4.2%]",
}
# the same nights when the sessions really spread by S=2%, L=1% and the GPU defaults were used
WRONG_SPREAD = ("A/A, sessions N(0,2%) and N(0,1%), the defaults used (0.5%, 0.1%)",
                "27.8% [23.6%, 32.3%]")
# interleaved pairs (regress run), a 5% linear drift over the allocation
PAIRED_AA = ("paired ABBA (regress run), A/A, 5% drift, sigma 2%, 10 trials",
             "0.0% [0.0%, 1.0%]")
# power: a 7% slowdown of 6 of 48 layouts at the defaults, slowed layouts confirmed
POWER = ("6 of 48 slowed 7%, sigma 2%, 10 trials", "97.9% [97.2%, 98.4%]")
SOURCE = "benchmarks/RESULTS-regress-error-rates.md"


def _worst(rates: dict[str, str]) -> tuple[str, str]:
    return max(rates.items(), key=lambda kv: float(kv[1].split("%")[0]))


def rate_line(design: str) -> str:
    """The measured false-alarm rate of this design (the worst of its regimes) and power."""
    if design == "interleaved":
        return (f"measured: A/A nights flagged {PAIRED_AA[1]} ({PAIRED_AA[0]}); "
                f"7% slowdowns of 6 of 48 layouts confirmed {POWER[1]} one session per tag: "
                f"{SOURCE}")
    name, worst = _worst(SESSIONS_AA)
    return (f"measured: A/A nights flagged at most {worst} over {len(SESSIONS_AA)} regimes "
            f"where S and L were right (worst: {name}), {WRONG_SPREAD[1]} when the sessions "
            f"spread 4x (S) and 10x (L) more than the values used; 7% slowdowns of 6 of 48 "
            f"layouts confirmed {POWER[1]}: {SOURCE}")
