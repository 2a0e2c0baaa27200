"""A key whose kept layouts are not all validly measured is marked incomplete, with the
layouts missing and why, in recommendations.csv and by `recommend`."""
from helpers import BARE_KEY, bare_row

from hcp_tune.store.folder import SweepKey, missing_layouts, recommendations


def test_a_cancelled_layout_makes_the_key_incomplete_and_is_named():
    rows = [bare_row(1, "ok", 0.1), bare_row(2, "cancelled")]
    assert missing_layouts(rows) == ["[2,1] cancelled"]
    (rec,) = recommendations(rows)
    assert rec["incomplete"] and rec["missing"] == "[2,1] cancelled"


def test_failed_layouts_name_their_class():
    assert missing_layouts([bare_row(1, "ok", 0.1), bare_row(2, "failed", failure_class="oom")]) == [
        "[2,1] failed oom"]


def test_a_layout_measured_later_completes_the_key():
    rows = [bare_row(1, "ok", 0.1), bare_row(2, "cancelled"), bare_row(2, "ok", 0.2)]
    (rec,) = recommendations(rows)
    assert not rec["incomplete"] and rec["missing"] == ""


def test_pruned_after_measuring_counts_as_measured_but_not_before():
    assert missing_layouts([bare_row(1, "ok", 0.1), bare_row(2, "pruned", 0.3)]) == []
    assert missing_layouts([bare_row(1, "ok", 0.1), bare_row(2, "pruned")]) == ["[2,1] pruned"]


def test_key_type_is_unchanged():
    assert SweepKey(**BARE_KEY).name.startswith("cluster=local|model=tiny")


def test_rows_from_a_newer_schema_are_refused_with_what_to_do(tmp_path):
    import json

    import pytest

    from hcp_tune.store.folder import ResultsTooNew, ResultStore

    store = ResultStore(tmp_path)
    store.add({**bare_row(1, "ok", 0.1), "schema_version": 99}, SweepKey(**BARE_KEY))
    with pytest.raises(ResultsTooNew, match=r"row schema 99 > 1, the newest this hcp-tune "
                                            r"reads: .* upgrade hcp-tune, or use another"):
        store.rows()
    old = {k: v for k, v in bare_row(1, "ok", 0.1).items()}  # written before versions: read
    (tmp_path / "rows").mkdir(exist_ok=True)
    for p in (tmp_path / "rows").glob("*/*.json"):
        p.write_text(json.dumps(old))
    (read,) = store.rows()  # an older row's missing fields take their defaults
    assert {k: read[k] for k in old} == old
    assert (read["steps"], read["error"], read["schema_version"]) == (0, "", 1)
