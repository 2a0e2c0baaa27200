"""A packed sweep end to end (issue 37): the CLI, the local executor, real gloo trials of
the pure-torch reference in packed (THD) mode. Every layout measures, proves its numerics
against per-document attention and is ranked under the mix's key; its FLOPs are the
documents' sum(d^2), not seq^2. Small: seq=1024, one trial a layout, 3 measured steps."""
import pytest
from helpers import TINY, hcp, result_file, rows

pytestmark = pytest.mark.multiproc

MIX = "lognormal:150:0.8"  # a few documents a 1024-token sequence, uneven


def test_packed_sweep_measures_verifies_and_ranks_under_the_mix(tmp_path):
    res = tmp_path / "results"
    r = hcp("sweep", "cp=4", "seq=1024", "data.packing=thd", f"data.lengths={MIX}", *TINY,
            "executor=local", f"results_dir={res}")
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(res)
    assert sorted((x["a2a"], x["p2p"], x["status"]) for x in got) == [
        (1, 4, "ok"), (2, 2, "ok"), (4, 1, "ok")], [x["error"] for x in got]
    assert all(x["verified"] and x["mix"].startswith(f"{MIX}#") for x in got)
    for row in got:
        trial = result_file(res, row)
        num, pk = trial.verification["numerics"], trial.verification["packing"]
        assert num["passed"] and num["reference"] == "float64 per document"
        assert pk["mix"] == row["mix"] and pk["documents"] > 1
        assert trial.flops_per_gpu_step == 3.5 * 2 * pk["attention_work"] * 8 * 8 / 4
        assert pk["attention_work"] < 0.6 * 1024**2  # the packed work, well under seq^2
    assert "ranked:" in r.stdout + r.stderr
