"""The report's Pareto front: what it marks when some layouts' memory was not measured."""
from hcp_tune.outputs.report import LayoutSummary, pareto


def layout(a2a: int, median_s: float, mem) -> LayoutSummary:
    return LayoutSummary(a2a=a2a, p2p=8 // a2a, comm_type="a2a+p2p", trials=3,
                         median_s=median_s, peak_mem_bytes=mem, steps_s=[median_s])


def test_front_is_the_layouts_nothing_beats_on_both_time_and_memory():
    fast_big, slow_small, dominated = layout(1, 1.0, 9e9), layout(2, 2.0, 1e9), layout(4, 3.0, 5e9)
    pareto([fast_big, slow_small, dominated])
    assert [s.pareto for s in (fast_big, slow_small, dominated)] == [True, True, False]


def test_unmeasured_memory_is_never_on_the_front_and_beats_nothing():
    """CPU trials carry no memory (None). Read as 0, the fastest CPU layout would sit on
    the front by a memory it never measured, and push measured layouts off it."""
    unmeasured, measured = layout(1, 0.5, None), layout(2, 1.0, 4e9)
    pareto([unmeasured, measured])
    assert unmeasured.pareto is False and measured.pareto is True
    only = [layout(1, 0.5, None), layout(2, 1.0, None)]
    pareto(only)
    assert not any(s.pareto for s in only)


def test_a_report_of_every_key_read_a_key_folder_at_a_time_is_the_same_page(tmp_path):
    """``report`` without env_tag summarises one key folder at a time (memory: one key's
    rows); the page equals the one summarised from every row at once."""
    from helpers import rows_for, store

    from hcp_tune.store.folder import ResultStore
    from hcp_tune.outputs import html_report, report
    from hcp_tune.outputs.regress.cli import _every_key

    root = store(tmp_path / "res", rows_for("b", 1, 2, [1.0, 1.2]) + rows_for("a", 2, 1, [0.9])
                 + rows_for("a", 1, 2, [1.1, 1.0], seq=8192)
                 + rows_for("c", 1, 2, [1.0], model="tiny-gqa"))
    pick = {"results_dir": root, "env_tag": None, "cluster": None, "model": None}
    at_once = report.summarize(ResultStore(root).rows(), **pick)
    by_key = _every_key(root, pick)
    assert len(by_key) == 4 and [k.key for k in by_key] == [k.key for k in at_once]
    assert html_report.report_page(by_key, "t") == html_report.report_page(at_once, "t")


def test_no_memory_chart_where_nothing_measured_memory():
    """CPU trials record RSS growth, often 0: their time-memory chart had an axis from
    -1e-09 to 1e-09. The page says why there is no chart instead."""
    from hcp_tune.outputs import html_report
    from hcp_tune.outputs.report import KeySummary

    def page(mems):
        layouts = [LayoutSummary(a, 4 // a, "a2a+p2p", 3, 1.0 + a / 10, m, [1.0, 1.1])
                   for a, m in zip((1, 2, 4), mems)]
        pareto(layouts)
        key = KeySummary({k: 1 for k in ("cluster", "model", "tp", "pp", "cp", "seq",
                                         "runner", "env_tag", "dp", "mbs", "micro_batches")},
                         layouts)
        return html_report.report_page([key], "report")

    for mems in ([0, 0, None], [0, 0, 0]):
        assert "peak memory (GiB)" not in page(mems) and "no time-memory chart" in page(mems)
    measured = page([1 << 30, 2 << 30, 3 << 30])
    assert "no time-memory chart" not in measured and "peak memory (GiB)" in measured
