"""The benchmark's bulk store generator (benchmarks/store_gen.py) writes what the sweep's
own write path writes: the store_scale figures are measured on a faithful folder."""
import importlib.util
import json
from pathlib import Path

from hcp_tune.store.folder import ResultStore
from hcp_tune.store.studies import Ledger

GEN = Path(__file__).resolve().parents[2] / "benchmarks" / "store_gen.py"


def _gen():
    spec = importlib.util.spec_from_file_location("store_gen", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.suffix != ".journal" and p.name not in (".lock", ".tables.json")}


def _ops(journal: Path) -> list[dict]:
    out = []
    for line in journal.read_text().splitlines():
        op = json.loads(line)
        op.pop("worker_id")
        for k in ("datetime_start", "datetime_complete"):
            if op.get(k) is not None:
                op[k] = "T"
        out.append(op)
    return out


def test_the_bulk_folder_is_the_real_write_paths_folder(tmp_path):
    gen = _gen()
    key_list = gen.keys(2, 3)  # two nights, three keys each (tp 1 and 2)
    real, bulk = tmp_path / "real", tmp_path / "bulk"
    gen.write_real(real, key_list, 12)
    gen.write_bulk(bulk, key_list, 12)
    journals = sorted(p.name for p in (real / "journals").glob("*.journal"))
    assert journals == sorted(p.name for p in (bulk / "journals").glob("*.journal"))
    assert len(journals) == 6  # one per key
    for name in journals:
        assert _ops(bulk / "journals" / name) == _ops(real / "journals" / name)
    assert _tree(bulk) == _tree(real)  # the row files, before any rebuild
    for root in (real, bulk):
        ResultStore(root).rebuild()
    assert _tree(bulk) == _tree(real)  # rows, trials.csv, recommendations.csv
    assert Ledger(ResultStore(bulk).ledger()).rows() == Ledger(ResultStore(real).ledger()).rows()
    statuses = {r["status"] for r in ResultStore(bulk).rows()}
    assert statuses == {"ok", "failed", "pruned"}
    recs = ResultStore(bulk).recommendations()
    assert len(recs) == 6 and all(r["pareto"] for r in recs)
