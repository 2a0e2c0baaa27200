"""Packed sequences in the key (issue 37): a packed sweep and a fixed-length one of the same
cp and seq are two keys; `recommend` answers each apart and its listing shows them apart;
a bad length mix is one line, exit 2, nothing written. Drawn by runner=synthetic, so the
whole sweep loop and store run in seconds (what a trial measures is the runners' tests)."""
import json
import subprocess
import sys

import pytest

from helpers import rows

KEY = ["cp=8", "seq=1024", "tp=1", "pp=1", "model=tiny", "cluster=local"]
PACKED = ["data.packing=thd", "data.lengths=sft"]
TRUTH = {"fixed": (0.100, 0.130, 0.160, 0.190), "packed": (0.190, 0.160, 0.130, 0.100)}


def hcp(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "hcp_tune", *args], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300)


def sweep(tmp_path, medians, *extra):
    truth = {"layouts": {str(a): {"median_s": m, "noise": {"kind": "lognormal", "cv": 0.01}}
                         for a, m in zip((1, 2, 4, 8), medians)}}
    path = tmp_path / f"truth-{len(extra)}.json"
    path.write_text(json.dumps(truth))
    return hcp(tmp_path, "sweep", *KEY, "runner=synthetic", f"runner.truth={path}",
               "runner.seed=3", "search.order_by_prediction=false", *extra)


def test_packed_and_fixed_keys_are_recommended_and_listed_apart(tmp_path):
    assert sweep(tmp_path, TRUTH["fixed"]).returncode == 0
    r = sweep(tmp_path, TRUTH["packed"], *PACKED)
    assert r.returncode == 0, r.stdout + r.stderr
    mixes = {x["mix"] if isinstance(x.get("mix"), str) else "" for x in rows(tmp_path / "results")}
    assert len(mixes) == 2 and "" in mixes
    label = next(m for m in mixes if m)
    assert label.startswith("sft#")

    def best(*extra):
        out = hcp(tmp_path, "recommend", *KEY, "runner=synthetic", "format=json", *extra)
        return json.loads(out.stdout)["recommendation"]

    assert (best()["a2a"], best()["mix"] in ("", None)) == (1, True)
    assert (best(*PACKED)["a2a"], best(*PACKED)["mix"]) == (8, label)
    listing = hcp(tmp_path, "recommend", "cluster=local").stdout.splitlines()
    at = next(i for i, ln in enumerate(listing) if ln.startswith("packed sequences"))
    assert any("[1,8]" in ln for ln in listing[:at])
    assert any("[8,1]" in ln and label in ln for ln in listing[at:])
    assert all(len(ln) <= 100 for ln in listing)


@pytest.mark.parametrize("lengths, text, words", [
    ("m.csv", "", "no document lengths"),
    ("m.csv", "100\n-3\n", "line 2 '-3'"),
    ("m.csv", "100\nlong\n", "line 2 'long'"),
    ("m.csv", "100\n4096\n", "a document of 4096 tokens is longer than seq=1024"),
    ("nosuch", None, "not a file, and not a preset"),
])
def test_a_bad_mix_is_one_line_exit_2_and_nothing_written(tmp_path, lengths, text, words):
    if text is not None:
        (tmp_path / lengths).write_text(text)
    r = sweep(tmp_path, TRUTH["fixed"], "data.packing=thd", f"data.lengths={lengths}")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "results").exists()
