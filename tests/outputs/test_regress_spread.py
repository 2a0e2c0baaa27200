"""``regress`` with one session per tag: the reference level (a broad regression found and
named, a release-wide one flagged once), the session spreads S and L (given, learned from
the folder, the profile's; printed; bad values one line and exit 2), and the size of the
custom parts (the reference rule's false alarms, the spread estimator's bias)."""
import math
import random

import numpy as np
import pytest
from helpers import CUDA_MEM, FP, rows_for, store

from hcp_tune.cli import main
from hcp_tune.outputs.regress import Options, compare, stats
from hcp_tune.outputs.regress.spread import components, from_history
from hcp_tune.outputs.regress.view import shared_levels, spread_line

SEQS = [1024 * 2 ** i for i in range(12)]  # 12 keys x 4 layouts of cp=8: 48 layouts
GIVEN = dict(session_spread=0.005, layout_spread=0.001)


def night(slowed, *, n=10, sd=0.02, seed=0, shift=1.0):
    """48 layouts, ``n`` trials per tag; ``slowed(a2a)``: the candidate 7% slower there."""
    rng = random.Random(seed)
    rows = []
    for seq in SEQS:
        for a2a in (1, 2, 4, 8):
            for tag, f in (("old", 1.0), ("new", shift * (1.07 if slowed(a2a) else 1.0))):
                rows += rows_for(tag, a2a, 8 // a2a,
                                 [f * rng.lognormvariate(0, sd) for _ in range(n)], seq=seq,
                                 mem=1000, mem_note=CUDA_MEM)
    return rows


def test_a_broad_regression_of_36_of_48_layouts_is_confirmed_and_named():
    """Every a2a > 1 layout 7% slower: the a2a = 1 layouts are the reference, all 36 slowed
    layouts are confirmed, no unchanged one is flagged, and the output names the path."""
    rep = compare(night(lambda a2a: a2a > 1, seed=11), Options("old", "new", **GIVEN))
    flagged = {(c.key[5], c.a2a) for c in rep.flagged}
    assert flagged <= {(seq, a2a) for seq in SEQS for a2a in (2, 4, 8)}
    assert len(flagged) >= 34  # 98% power each: 35 here
    assert all(c.verdict == "regression" for c in rep.flagged)
    assert rep.shift.verdict == "ok" and 9 <= rep.shift_from <= 12 and rep.exit_code == 1
    (line,) = shared_levels(rep)
    assert line.startswith("every layout with a2a > 1 slowed ")
    assert line.endswith(f"({len(flagged)} of 36 confirmed): the all-to-all path")


def test_a_slowdown_of_every_layout_is_one_regression_of_the_release():
    rep = compare(night(lambda a2a: True, seed=12), Options("old", "new", **GIVEN))
    assert rep.shift.verdict == "regression" and not rep.flagged and rep.exit_code == 1
    assert rep.shift_from >= 44 and shared_levels(rep) == []  # a layout 2 sd out may sit out


def test_the_spreads_given_are_printed_with_the_verdict(tmp_path, capsys):
    res = store(tmp_path / "res", night(lambda a2a: False, n=3))
    assert main(["regress", "baseline=old", "candidate=new", f"results_dir={res}",
                 "session_spread=0.01", "layout_spread=0.005"]) in (0, 4)
    out = " ".join(capsys.readouterr().out.split())
    assert "session spread S=1%, layout spread L=0.5% (given)" in out
    md = (res / "regress-old-vs-new.md").read_text()
    assert "session spread S=1%, layout spread L=0.5% (given)" in " ".join(md.split())


def test_without_them_the_cluster_profile_is_used_and_named(tmp_path, capsys):
    res = store(tmp_path / "res", night(lambda a2a: False, n=3))
    main(["regress", "baseline=old", "candidate=new", f"results_dir={res}"])
    out = " ".join(capsys.readouterr().out.split())
    assert "session spread S=42%, layout spread L=0% (cluster profile local)" in out


@pytest.mark.parametrize("arg,value", [("session_spread", "-0.01"), ("layout_spread", "abc"),
                                       ("session_spread", "1.5"), ("layout_spread", "nan")])
def test_a_bad_spread_is_one_line_and_exit_2(arg, value, capsys):
    assert main(["regress", "baseline=a", "candidate=b", f"{arg}={value}"]) == 2
    err = capsys.readouterr().err
    assert f"{arg}={value}: expected a relative standard deviation, a fraction in [0, 1)" in err
    assert len(err.strip().splitlines()) == 1


def test_the_nearest_accepted_spread_is_zero():
    assert Options("a", "b", session_spread=0.0, layout_spread=0.0).session_spread == 0.0


def test_one_key_with_three_of_four_layouts_slowed_keeps_the_unchanged_one_as_reference():
    """A paired run of one key (4 layouts) whose a2a > 1 layouts slowed 10%: too few
    layouts for a group of 3 to be required, and a 10% level is no session shift when the
    session cancels. The unchanged [1,8] is the reference ("ok"), not an UNEXPECTED
    SPEED-UP beside a release-wide "shift"; the three slowed ones are regressions."""
    rng = random.Random(5)
    rows = []
    for a2a in (1, 2, 4, 8):
        for tag, f in (("old", 1.0), ("new", 1.0 if a2a == 1 else 1.10)):
            rows += rows_for(tag, a2a, 8 // a2a, [f * rng.lognormvariate(0, 0.01)
                                                  for _ in range(5)])
    rep = compare(rows, Options("old", "new", design="interleaved"))
    assert rep.shift.verdict == "ok" and rep.shift_from == 1
    assert sorted(c.a2a for c in rep.flagged) == [2, 4, 8]
    assert all(c.verdict == "regression" for c in rep.flagged) and rep.exit_code == 1
    (line,) = shared_levels(rep)
    assert line.startswith("every layout with a2a > 1 slowed ")


def test_interleaved_pairs_use_no_session_spread():
    rows = rows_for("old", 2, 2, [1.0, 1.01, 0.99]) + rows_for("new", 2, 2, [1.0, 1.01, 0.99])
    rep = compare(rows, Options("old", "new", design="interleaved"))
    assert rep.spread is None and spread_line(rep).startswith("session spread: not used")


def _stack_rows(tag, shift, effects, rng, n=4, fp=None):
    rows = []
    for (seq, a2a), eff in effects.items():
        rows += rows_for(tag, a2a, 8 // a2a, [shift * eff * rng.lognormvariate(0, 0.002)
                                              for _ in range(n)], seq=seq, fp=fp)
    return rows


def nights_of_a_stack(tags, cand, *, seqs, seed, session, layout):
    """One stack measured under ``tags`` (a session each: shift N(0, session), each layout
    N(0, layout) more), and ``cand`` on another TE, 1.5x slower everywhere."""
    rng = random.Random(seed)
    keys = [(seq, a2a) for seq in seqs for a2a in (1, 2, 4, 8)]
    rows = []
    for tag in tags:
        effects = {k: math.exp(rng.gauss(0, layout)) for k in keys}
        rows += _stack_rows(tag, math.exp(rng.gauss(0, session)), effects, rng)
    return rows + _stack_rows(cand, 1.5, {k: 1.0 for k in keys}, rng,
                              fp={**FP, "transformer_engine": "2.10.0"})


def test_the_spreads_are_learned_from_a_stack_measured_in_several_sessions():
    """Four nights of the same stack under their own tags: S and L come from them (the
    candidate's tag never counts), and the source says so."""
    rows = nights_of_a_stack(["n0", "n1", "n2", "n3"], "cand", seqs=SEQS[:4], seed=3,
                             session=0.03, layout=0.01)
    got = from_history(rows, "cand")
    assert got is not None and got.source.startswith("learned from 4 sessions in this folder")
    assert 0.005 < got.session < 0.08 and 0.004 < got.layout < 0.02
    assert from_history(rows, "n0").source.startswith("learned from 3 sessions")


def test_the_spread_estimator_is_unbiased_on_the_variance_scale():
    """``components`` on 400 simulated folders (8 layouts x 5 sessions, 5 trials of 1%
    noise, S=1.5%, L=0.7%): the mean estimates of S^2 and L^2 within 10% of the truth
    (clipping at 0 biases them up a little; the trial noise must not)."""
    rng = np.random.default_rng(0)
    s_true, l_true, sd, n = 0.015, 0.007, 0.01, 5
    est = []
    for _ in range(400):
        shift = rng.normal(0, s_true, 5)
        cells = {}
        for i in range(8):
            for j in range(5):
                x = rng.normal(shift[j] + rng.normal(0, l_true), sd, n)
                cells[(i, j)] = (float(x.mean()), float(x.var(ddof=1)), n)
        est.append(components({"stack": cells})[:2])
    s2, l2 = np.mean(est, axis=0)
    assert s2 == pytest.approx(s_true ** 2, rel=0.1) and l2 == pytest.approx(l_true ** 2, rel=0.1)


def test_a_a_nights_with_the_spreads_given_flag_at_most_the_family_wise_rate():
    """The reference rule's size: 300 A/A nights of 48 layouts whose tags' sessions really
    shift by N(0, S) and N(0, L) (S=2%, L=1%, sigma 2%, 10 trials), the rule told S and L:
    any flag on <= 5% of nights (plus the simulation's own error: < 9 %)."""
    rng = np.random.default_rng(1)
    flagged = 0
    for _ in range(300):
        base, cand = rng.normal(0, 0.02, (2, 48, 10))
        base += rng.normal(0, 0.02) + rng.normal(0, 0.01, (48, 1))
        cand += rng.normal(0, 0.02) + rng.normal(0, 0.01, (48, 1))
        (judged,) = stats.judge_all([stats.night(stats._changes(base, cand), 0.02, 0.01)],
                                    [0.05])
        flagged += any(e.verdict in ("regression", "improvement")
                       for e in (judged.shift,) + judged.layouts)
    assert flagged / 300 < 0.09


def test_regress_learns_the_spreads_from_the_folder_and_says_so(tmp_path, capsys):
    """The CLI reads the other tags of the compared keys: three nights of the baseline's
    stack teach S and L, and the verdict names where they came from."""
    rows = nights_of_a_stack([f"te-2.9-n{i}" for i in range(3)], "te-2.10", seqs=SEQS[:3],
                             seed=5, session=0.02, layout=0.005)
    res = store(tmp_path / "res", rows)
    main(["regress", "baseline=te-2.9-n0", "candidate=te-2.10", f"results_dir={res}"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(learned from 3 sessions in this folder (te-2.9-n0, te-2.9-n1, te-2.9-n2;" in out
