"""``recommend cluster=NAME`` with no key: every measured key of the cluster (issue 31)."""
import csv
import io
import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers import rows_for  # noqa: E402

from hcp_tune import cli  # noqa: E402
from hcp_tune.store.folder import ResultStore, SweepKey  # noqa: E402
from hcp_tune.outputs import cluster_table  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """tiny at seq 4096 and 8192 under te-old, seq 4096 again under te-new (stored later)."""
    root = tmp_path_factory.mktemp("results")
    store = ResultStore(root)
    batches = [("te-old", 4096, 1.0), ("te-old", 8192, 2.0), ("te-new", 4096, 0.9)]
    for i, (tag, seq, base) in enumerate(batches):
        for r in rows_for(tag, 2, 2, [base] * 3, seq=seq) + rows_for(tag, 1, 4, [base * 1.5] * 3,
                                                                       seq=seq):
            store.add(r, SweepKey.of(r))
        folder = root / "rows" / SweepKey.of(r).slug
        os.utime(folder, (1_700_000_000 + i * 86_400,) * 2)  # stored one day after another
    store.rebuild()
    return root


def run(capsys, *args):
    code = cli.main(["recommend", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_lists_every_key_with_its_newest_tag_and_names_the_tags(folder, capsys):
    code, out, _ = run(capsys, "cluster=local", f"results_dir={folder}")
    assert code == 0
    lines = out.splitlines()
    head = " ".join(lines[:3])
    assert "te-new (1 key(s))" in head and "te-old (2 key(s))" in head
    table = [ln for ln in lines if ln.startswith("tiny ")]
    assert len(table) == 2
    assert "4096" in table[0] and "te-new" in table[0] and "[2,2]" in table[0]
    assert "8192" in table[1] and "te-old" in table[1]
    assert all(len(ln) <= 100 for ln in lines)
    # each key's verdict (two layouts, the other 1.5x slower in every trial: settled), and
    # the rate at which a settled verdict was wrong, stated once under the table
    assert all(" settled " in ln for ln in table)
    assert "verdicts: settled: a settled pick was wrong in at most" in " ".join(lines)


def test_env_tag_filters_and_csv_json_md_carry_the_overrides(folder, capsys):
    code, out, err = run(capsys, "cluster=local", "env_tag=te-old", "format=csv",
                         f"results_dir={folder}")
    assert code == 0 and err == ""
    got = list(csv.DictReader(io.StringIO(out)))
    assert [(r["seq"], r["env_tag"]) for r in got] == [("4096", "te-old"), ("8192", "te-old")]
    assert "hierarchical_context_parallel_sizes=[2,2]" in got[0]["bridge_overrides"]
    code, out, _ = run(capsys, "cluster=local", "model=tiny", "format=json", f"results_dir={folder}")
    assert code == 0 and len(json.loads(out)) == 2
    code, out, _ = run(capsys, "cluster=local", "format=md", f"results_dir={folder}")
    assert code == 0 and out.count("\n| local |") == 2


def test_verdict_column_is_shown_when_the_table_has_it(folder):
    recs = [{**r, "verdict": "settled"} for r in ResultStore(folder).recommendations()]
    rows, _ = cluster_table.listing(recs, folder, {"cluster": "local"})
    assert {r["verdict"] for r in rows} == {"settled"}


def test_a_cluster_with_nothing_measured_names_the_measured_ones(folder, capsys):
    code, out, _ = run(capsys, "cluster=dgx-h100", f"results_dir={folder}")
    assert code == 3 and "clusters measured there: local" in out


def test_one_key_says_which_tag_it_read(folder, capsys):
    code, out, err = run(capsys, "cluster=local", "model=tiny", "cp=4", "seq=4096", "tp=1",
                         f"results_dir={folder}")
    assert code == 0
    assert "measured under te-new, te-old" in err and "env_tag=NAME picks one" in err
