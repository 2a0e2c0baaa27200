"""``regress`` as a new user meets it: report files that keep the whole tag, a table that
fits 100 columns without cutting a verdict, ``regress power`` and ``regress run``'s input
checks (one line, exit 2), and a tag swept with early stopping explained. In-process
(``hcp_tune.cli.main``): no interpreter start per case."""
import random
import re

import pytest
from helpers import CUDA_MEM, rows_for, store

from hcp_tune.cli import main

LAYOUTS = [(seq, a2a, 8 // a2a) for seq in (4096, 8192, 16384) for a2a in (1, 2, 4, 8)]


def stored(tmp_path, base="te-2.9", cand="te-2.10", slow=1.08, n=5, sd=0.02, seed=0):
    rng = random.Random(seed)
    rows = []
    for i, (seq, a2a, p2p) in enumerate(LAYOUTS):
        for tag, f in ((base, 1.0), (cand, slow if i in (1, 6) else 1.0)):
            rows += rows_for(tag, a2a, p2p, [f * rng.lognormvariate(0, sd) for _ in range(n)],
                             seq=seq, mem=1000, mem_note=CUDA_MEM)
    rows += rows_for(cand, 1, 8, [2.0] * 3, seq=32768) + rows_for(base, 1, 8, [1.0] * 3,
                                                                  seq=32768)
    return store(tmp_path / "res", rows)


def test_report_files_keep_the_whole_tag_and_verdicts_are_never_cut(tmp_path, monkeypatch,
                                                                  capsys):
    monkeypatch.setenv("COLUMNS", "100")
    res = stored(tmp_path)
    assert main(["regress", "baseline=te-2.9", "candidate=te-2.10", f"results_dir={res}"]) == 1
    out = capsys.readouterr().out
    names = sorted(p.name for p in res.glob("regress-*"))
    assert names == ["regress-te-2.9-vs-te-2.10.html", "regress-te-2.9-vs-te-2.10.md"]
    table = [line for line in out.splitlines() if line.startswith(" [")]
    assert len(table) == len(LAYOUTS) + 1 and all(len(line) <= 100 for line in table)
    whole = re.compile(r" (ok|REGRESSION|INCONCLUSIVE ~\d+/tag|INCONCLUSIVE) +"
                       r"(1\.\d{3} ok|n/a) *$")
    assert all(whole.search(line) for line in table), table  # verdict and memory whole
    assert sum(" REGRESSION " in line for line in table) >= 1  # the layout 2x slower
    assert "…" not in out
    assert "family-wise error rate 0.05 (Holm over" in out


def test_two_candidate_tags_never_share_a_report(tmp_path, capsys):
    res = stored(tmp_path)
    stored(tmp_path, cand="te-2.11")  # the same results folder, a third tag
    for cand in ("te-2.10", "te-2.11"):
        main(["regress", "baseline=te-2.9", f"candidate={cand}", f"results_dir={res}"])
    capsys.readouterr()
    assert {p.name for p in res.glob("regress-*.md")} == {
        "regress-te-2.9-vs-te-2.10.md", "regress-te-2.9-vs-te-2.11.md"}


@pytest.mark.parametrize("args,message", [
    (["effect=-1"], "effect=-1: expected the change to detect, a fraction > -1"),
    (["effect=abc"], "effect='abc': expected a number, e.g. effect=0.07"),
    (["effect=0.03"], "effect=0.03 is within the threshold (0.05)"),
    (["noise=0.02"], "regress power needs effect="),
    (["effect=0.07", "noise=-0.1"], "noise=-0.1: expected the per-trial relative spread"),
    (["effect=0.07", "layouts=0"], "layouts=0: expected the number of layouts compared"),
    (["effect=0.07", "colour=red"], "colour=red: regress power takes key=value arguments"),
])
def test_regress_power_bad_input_is_one_line_exit_2(args, message, capsys, tmp_path):
    assert main(["regress", "power", *args, f"results_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_regress_power_answers_with_the_trials_and_the_sweep_setting(capsys):
    assert main(["regress", "power", "effect=0.1", "noise=0.02"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # prose wraps at the width
    n = int(out.split(" trials per tag")[0].rsplit(" ", 1)[1])
    assert 3 <= n <= 10 and f"search.repeats={n} search.purpose=regress" in out
    assert "family-wise rate 0.05 over 98 tests (48 layouts" in out


def test_regress_power_reads_the_noise_from_stored_trials(tmp_path, capsys):
    res = stored(tmp_path, sd=0.03)
    assert main(["regress", "power", "effect=0.2", "layouts=8", f"results_dir={res}",
                 "baseline=te-2.9"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(read from the stored trials of te-2.9)" in out
    noise = float(out.split("per-trial noise ")[1].split("%")[0])
    assert 1.5 < noise < 4.5  # the 3% drawn, estimated from 15 layouts x 5 trials


@pytest.mark.parametrize("args,message", [
    (["baseline=a", "candidate=b", "candidate_args=cp=4"], "regress run needs baseline_args="),
    (["baseline=a", "candidate=b", "baseline_args=cp=4", "candidate_args=cp=4", "trials=2"],
     "trials=2: expected the trials per tag, an integer from 3"),
])
def test_regress_run_bad_input_is_one_line_exit_2(args, message, capsys):
    assert main(["regress", "run", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_tag_swept_with_early_stopping_is_explained(tmp_path, capsys):
    rows = (rows_for("old", 2, 2, [1.0] * 3) + rows_for("new", 2, 2, [1.0])
            + rows_for("new", 2, 2, [1.0, 1.0], status="pruned"))
    res = store(tmp_path / "res", rows)
    assert main(["regress", "baseline=old", "candidate=new", f"results_dir={res}"]) == 2
    err = capsys.readouterr().err
    assert "2 of their trials were pruned (stopped early)" in err
    assert "search.purpose=regress" in err


def test_regress_run_alternates_the_tags_round_by_round_and_pairs_them(tmp_path, monkeypatch,
                                                                       capsys):
    """``regress run``: round r sweeps both tags to r trials each, A first in odd rounds
    and B first in even ones (ABBA: a linear drift favours neither tag), every sweep
    never early-stops, and the verdict rests on the pairs (``design: interleaved``): a
    drift through the night that one session per tag would read as noise cancels."""
    from hcp_tune.outputs.regress import plan

    res = tmp_path / "res"
    calls = []

    def sweep(args):  # stands in for `python -m hcp_tune sweep ...`: one trial per layout
        kv = dict(a.split("=", 1) for a in args[1:])
        calls.append((kv["env_tag"], int(kv["search.repeats"]), kv["search.purpose"]))
        r = int(kv["search.repeats"])
        slow = 1.08 if kv["env_tag"] == "te-2.10" else 1.0
        store(res, rows_for(kv["env_tag"], 2, 2, [slow * (1 + 0.06 * r)]))
        return 0

    monkeypatch.setattr(plan, "run_sweep", sweep)
    rc = main(["regress", "run", "baseline=te-2.9", "candidate=te-2.10", "trials=5",
               "baseline_args=cp=4 executor=local", "candidate_args=cp=4 executor=local",
               f"results_dir={res}"])
    out = " ".join(capsys.readouterr().out.split())  # prose wraps at the width
    abba = [(t, r) for r in range(1, 6)
            for t in (("te-2.9", "te-2.10") if r % 2 else ("te-2.10", "te-2.9"))]
    assert [c[:2] for c in calls] == abba
    assert {c[2] for c in calls} == {"regress"}
    assert rc == 1 and "design: interleaved ABBA" in out and " REGRESSION " in out
    assert (res / "regress-te-2.9-vs-te-2.10.md").exists()


def test_a_failed_trial_drops_its_own_pair_only():
    """Paired trials are matched by their position in the plan (round r's trial of each
    tag), not by counting the ok ones: a failure in round 2 of the baseline drops round 2's
    pair, and rounds 3-6 stay paired with their own rounds. Each round drifts 10%; the
    candidate is 8% slower: paired by round, the 8% is confirmed and every pair reads
    1.08; paired by counting, later pairs would mix rounds and read 0.98-0.99."""
    from hcp_tune.outputs.regress import Options, compare

    rows = []
    for r in range(6):
        drift = 1 + 0.1 * r
        rows += rows_for("old", 2, 2, [drift], status="failed" if r == 1 else "ok")
        rows += rows_for("new", 2, 2, [drift * 1.08])
    rep = compare(rows, Options(baseline="old", candidate="new", design="interleaved"))
    (c,) = rep.comparisons
    assert len(c.base_s) == len(c.cand_s) == 5  # round 2's pair dropped, nothing else
    assert all(abs(n / b - 1.08) < 1e-9 for b, n in zip(c.base_s, c.cand_s))
    assert c.verdict == "regression" and rep.spread is None  # the session cancels


def _lone_command_or_path(line: str) -> bool:
    """A line a user copies whole: a command standing alone, or one path (no spaces)."""
    text = line.strip()
    return text.startswith("python -m hcp_tune ") or (text and " " not in text)


def test_no_line_of_regress_is_wider_than_the_terminal_but_a_lone_command(tmp_path, monkeypatch,
                                                                          capsys):
    """COLUMNS=80: the tables fit, the prose wraps, and each settle command (longer than
    80) stands on a line of its own, whole, after its reason; a memory line wraps too."""
    monkeypatch.setenv("COLUMNS", "80")
    res = stored(tmp_path, slow=1.03, n=3)  # small changes, 3 trials: inconclusive layouts
    assert main(["regress", "baseline=te-2.9", "candidate=te-2.10",
                 f"results_dir={res}"]) in (1, 4)
    lines = capsys.readouterr().out.splitlines()
    wide = [x for x in lines if len(x) > 80 and not _lone_command_or_path(x)]
    assert not wide, wide
    commands = [x.strip() for x in lines if x.strip().startswith("python -m hcp_tune sweep")]
    assert commands and all(len(c) > 80 and "search.purpose=regress" in c for c in commands)
    assert any(x.startswith("to settle (80% power") for x in lines)
    assert not any("to settle" in x and "python -m" in x for x in lines)
    assert any(x.startswith("memory not judged for [1,8]") for x in lines)


def test_regress_run_prints_each_sweep_command_alone(tmp_path, monkeypatch, capsys):
    from hcp_tune.outputs.regress import plan

    monkeypatch.setenv("COLUMNS", "80")
    res = tmp_path / "res"

    def sweep(args):  # one trial per tag and round, as in the test above
        kv = dict(a.split("=", 1) for a in args[1:])
        store(res, rows_for(kv["env_tag"], 2, 2, [1.0 + 0.01 * int(kv["search.repeats"])]))
        return 0

    monkeypatch.setattr(plan, "run_sweep", sweep)
    main(["regress", "run", "baseline=te-2.9", "candidate=te-2.10", "trials=3",
          "baseline_args=cp=4 executor=local executor.container_image=/images/te-2.9.sqsh",
          "candidate_args=cp=4 executor=local executor.container_image=/images/te-2.10.sqsh",
          f"results_dir={res}"])
    lines = capsys.readouterr().out.splitlines()
    assert not [x for x in lines if len(x) > 80 and not _lone_command_or_path(x)]
    rounds = [i for i, x in enumerate(lines) if x.startswith("regress run: round ")]
    assert len(rounds) == 6
    assert all(lines[i + 1].startswith("  python -m hcp_tune sweep cp=4") for i in rounds)
