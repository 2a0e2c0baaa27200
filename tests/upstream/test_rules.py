"""The rules table itself: one entry per rule, each documented, and the docs list them."""
import re
from pathlib import Path

from hcp_tune.config.settings import CP_MAX, SEQ_MAX, TP_MAX
from hcp_tune.upstream.rules import BY_ID, LAYOUT_RULES, RULES, Facts, evaluate

REPO = Path(__file__).resolve().parents[2]
CONFIGURATION = (REPO / "docs" / "reference" / "configuration.md").read_text()


def _rules_table_page() -> str:
    """The docs site's rules table, as the build hook (scripts/docs_pages.py) writes it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_pages", REPO / "scripts" / "docs_pages.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return hook.rules_table_page()


def test_ids_are_unique_and_each_rule_says_what_it_reads_and_means():
    assert len(BY_ID) == len(RULES)
    for r in RULES:
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", r.id), r.id
        assert r.reads and r.means and r.source and r.severity in ("error", "warning", "info")


def test_docs_rules_table_lists_every_rule_with_its_severity():
    rows = dict(re.findall(r"^\| `([a-z0-9-]+)` \| (error|warning|info) \|", _rules_table_page(),
                           re.M))
    assert rows == {r.id: r.severity for r in RULES}


def test_docs_state_the_size_ranges_the_loader_enforces():
    for key, top in (("cp", CP_MAX), ("tp", TP_MAX)):
        assert f"| `{key}` | integer 1..{top}" in CONFIGURATION
    assert f"integer 1..{SEQ_MAX} (2^24)" in CONFIGURATION


def test_layout_rules_are_the_ones_plan_checks():
    assert {r.id for r in LAYOUT_RULES} == {"seq-divisible", "heads-tp", "heads-a2a",
                                            "heads-even-a2a", "a2a-cross-node", "layers-pp",
                                            "pp-stage-placement", "thd-no-backend",
                                            "thd-te-unknown"}


def test_findings_come_errors_first_with_the_rule_text():
    f = Facts(cp=8, tp=1, seq=131000, heads=32, kv_heads=8, comm_types=("a2a+p2p",),
              sizes=(16, 1), gpus_per_node=8)
    out = evaluate(f)
    assert [x.severity for x in out] == sorted((x.severity for x in out),
                                               key=["error", "warning", "info"].index)
    assert out[0].text.startswith(f"[{out[0].rule}] ") and "; fix: " in out[0].text
