"""The rates ``regress`` prints beside its verdicts are the ones its benchmark wrote: a
results file that moves without ``regress/rates.py`` fails here."""
from pathlib import Path

import pytest

from hcp_tune.outputs.regress import rates

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "RESULTS-regress-error-rates.md"


def cell(regime: str, column: int) -> str:
    """A cell of the results file's row for ``regime`` (0: the regime's name)."""
    for line in RESULTS.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == regime:
            return cells[column]
    raise AssertionError(f"no row {regime!r} in {RESULTS.name}")


@pytest.mark.parametrize("regime,rate", [*rates.SESSIONS_AA.items(), rates.WRONG_SPREAD,
                                         rates.PAIRED_AA])
def test_the_printed_false_alarm_rates_are_the_benchmarks(regime, rate):
    assert cell(regime, 2) == rate


def test_the_printed_power_is_the_benchmarks():
    assert cell(rates.POWER[0], 3) == rates.POWER[1]


def test_each_design_prints_its_own_worst_regime():
    one = rates.rate_line("sessions")
    assert max(rates.SESSIONS_AA.values(), key=lambda r: float(r.split("%")[0])) in one
    assert rates.PAIRED_AA[1] in rates.rate_line("interleaved")
