"""``regress`` names known upstream causes (hcp_tune/outputs/regress/known_causes.yaml)
beside a flagged layout whose key and stacks match, through the real CLI path
(``hcp_tune.cli.main``, rows stored as sweeps store them); nothing is silenced: the verdict,
the summary and the exit code are the same as with no cause known."""
import dataclasses
import random
import re

import pytest
from helpers import CUDA_MEM, FP, rows_for

from hcp_tune.cli import main
from hcp_tune.store.records import SweepKey
from hcp_tune.store.folder import ResultStore
from hcp_tune.outputs.regress import known

MIX = "web#1a2b3c"
LAYOUTS = [(seq, a2a, 8 // a2a) for seq in (4096, 8192, 16384) for a2a in (1, 2, 4, 8)]
SLOW = {(4096, 1), (8192, 8)}  # [1,8] p2p at 4096 and [8,1] a2a at 8192: 10% slower


def _store(res, rows):
    s = ResultStore(res)
    for r in rows:
        s.add(r, SweepKey(**{k: r[k] for k in ("cluster", "model", "tp", "cp", "seq", "runner",
                                                "env_tag", "mix")}))
    return res


def stored(tmp_path, *, base_te="2.17.1", cand_te="2.18.0", mix=MIX, seed=0):
    """Two tags of 12 layouts, 5 trials each; two layouts 10% slower under the candidate."""
    rng = random.Random(seed)
    rows = []
    for seq, a2a, p2p in LAYOUTS:
        for tag, te, f in (("old", base_te, 1.0),
                           ("new", cand_te, 1.1 if (seq, a2a) in SLOW else 1.0)):
            fp = {**FP, "transformer_engine": te}
            rows += [{**r, "mix": mix} for r in rows_for(
                tag, a2a, p2p, [f * rng.lognormvariate(0, 0.01) for _ in range(5)], seq=seq,
                mem=1000, mem_note=CUDA_MEM, fp=fp)]
    return _store(tmp_path / "res", rows)


def regress(res, capsys):
    code = main(["regress", "baseline=old", "candidate=new", f"results_dir={res}"])
    out = " ".join(capsys.readouterr().out.split())  # prose wraps at the width
    return code, out


def test_a_packed_p2p_regression_after_a_te_218_bump_prints_te_3487_beside_its_verdict(
        tmp_path, capsys):
    code, out = regress(stored(tmp_path), capsys)
    assert code == 1  # the regressions still count
    assert (f"seq=4096 runner=attention mix={MIX} [1,8] p2p REGRESSION known: TE #3487: "
            "THD with distinct (equal) padded cu_seqlens") in out
    # the a2a layout is not on the ring: the generic TE-bump cause, not #3487
    assert "[8,1] a2a REGRESSION known: Megatron-LM #5781" in out
    assert out.count("known: ") == 2  # only the flagged layouts
    md = (tmp_path / "res" / "regress-old-vs-new.md").read_text()
    assert "## Known upstream causes" in md and "[1,8] p2p REGRESSION known: TE #3487" in md


def test_nothing_is_silenced_the_verdicts_and_exit_code_match_a_run_with_no_cause(
        tmp_path, capsys):
    code, out = regress(stored(tmp_path / "a"), capsys)
    same_te, out_plain = regress(stored(tmp_path / "b", base_te="2.18.0"), capsys)
    assert "known: " not in out_plain  # same TE on both sides, no cause applies
    assert code == same_te == 1
    summary = lambda o: o[o.index("regress old -> new:"):].split(" wrote ")[0]  # noqa: E731
    assert summary(out) == summary(out_plain)  # the counts, the threshold, the exit code


def test_fixed_length_keys_never_get_the_packed_cause(tmp_path, capsys):
    code, out = regress(stored(tmp_path, mix=""), capsys)
    assert code == 1 and "TE #3487" not in out and "mix=" not in out
    assert "[1,8] p2p REGRESSION known: Megatron-LM #5781" in out


def test_a_baseline_on_te_2171_with_packed_p2p_is_named_as_possibly_wrong(tmp_path, capsys):
    code, out = regress(stored(tmp_path, base_te="2.16.0", cand_te="2.17.1"), capsys)
    assert "[1,8] p2p REGRESSION known: TE #3331: THD with p2p or a2a+p2p" in out
    assert "the baseline's times may be of wrong attention" in out
    assert code == 1


def test_packed_and_fixed_rows_of_one_key_are_never_pooled(tmp_path):
    from hcp_tune.outputs.regress import Options, compare

    res = stored(tmp_path)
    packed = ResultStore(res).rows()
    fixed = [{**r, "mix": ""} for r in packed]  # the same layouts, one document a sequence
    report = compare(packed + fixed, Options(baseline="old", candidate="new"))
    assert len(report.keys) == 2 * 3  # three seqs, each packed and fixed
    assert all(len(c.base_s) == 5 == len(c.cand_s) for c in report.comparisons)
    assert {k.key[-1] for k in report.keys} == {MIX, ""}


@pytest.mark.parametrize("version,condition,expected", [
    ("2.18.0", ">=2.18", True), ("2.17.1+4329ff8", ">=2.18", False),
    ("2.17.1", "<=2.17.1", True), ("2.17.2", "<=2.17.1", False),
    ("2.18.0.dev0", "<2.18", False), ("2.19.0", ">=2.18,<2.20", True),
    ("2.20.1", ">=2.18,<2.20", False),
])
def test_version_conditions_compare_release_numbers(version, condition, expected):
    assert known.meets(known.version_tuple(version), condition) is expected


def test_every_shipped_cause_cites_an_issue_and_a_source():
    causes = known.shipped()
    assert {c.id for c in causes} == {"TE #3487", "TE #3331", "Megatron-LM #5781"}
    assert all(c.url.startswith("https://github.com/") and c.source for c in causes)
    assert all(c.url.endswith(c.id.split("#")[1]) for c in causes)


@pytest.mark.parametrize("entry,message", [
    ({"id": "x", "url": "u", "cause": "c", "source": "s", "when": {"te": ">=2"}},
     "unknown condition(s) te"),
    ({"id": "x", "url": "u", "cause": "c", "source": "s",
      "when": {"candidate_te": "2.18"}}, "version condition '2.18'"),
    ({"id": "x", "url": "u", "cause": "c", "when": {"packing": "thd"}}, "lacks source"),
])
def test_a_malformed_cause_is_refused_naming_it(entry, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        known.parse([entry])


def test_a_stack_with_no_te_version_recorded_matches_no_te_condition():
    cause = known.parse([{"id": "x", "url": "u", "cause": "c", "source": "s",
                          "when": {"candidate_te": ">=2.18"}}])[0]
    none, new = known.Stack(frozenset()), known.Stack(frozenset({(2, 18, 0)}))
    kw = dict(packed=True, comm_type="p2p", verdict="regression")
    assert known.applies(cause, base=none, cand=new, **kw)
    assert not known.applies(cause, base=new, cand=none, **kw)
    assert dataclasses.is_dataclass(cause)
