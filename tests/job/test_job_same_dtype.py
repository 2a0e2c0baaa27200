"""The GPU path's pieces that run without a GPU (issue 8, items 2 and 3).

- The proof in low precision: the CP run against the same attention without CP in the same
  dtype, elementwise assert_close with TE's tolerances. ``backend=torch dtype=bf16/fp16``
  takes that path with the torch reference on gloo, so the comparison itself (gathering,
  reordering, the metric, the planted CP-off) is tested here as the TE path uses it.
- TE's "Selected backend = ..." log line, parsed and captured from TE's logger.
- The q/k/v layouts (sbhd, bshd) and reading results written before the new fields.
"""
import json
import logging

import pytest
import torch
from helpers import make_spec

from hcp_tune.job.attention import verify
from hcp_tune.job.attention.te import TE_LOGGER, BackendLog, parse_selected_backend
from hcp_tune.space.layout import Layout
from hcp_tune.spec import (
    FailureClass,
    Status,
    TrialResult,
    result_from_json,
    spec_from_json,
    to_json,
)


@pytest.fixture(scope="module")
def low_precision(tmp_path_factory):
    from hcp_tune.engine.launch import run_local_batch

    specs = [
        make_spec(Layout(2, 2), seq=256, backend="torch", dtype="bf16", trial_id="bf16-2x2"),
        make_spec(Layout(2, 2), model="tiny-gqa", seq=256, backend="torch", dtype="bf16",
                  trial_id="bf16-gqa-2x2"),
        make_spec(Layout(1, 4), seq=256, backend="torch", dtype="fp16", trial_id="fp16-1x4"),
        make_spec(Layout(2, 2), seq=256, backend="torch", dtype="bf16", inject_fault="cp_off",
                  trial_id="bf16-cp-off"),
    ]
    results = run_local_batch(specs, workdir=tmp_path_factory.mktemp("lowp"))
    return {r.trial_id: r for r in results}


@pytest.mark.multiproc
@pytest.mark.parametrize("trial, dtype, tol", [("bf16-2x2", "bf16", 2.5e-2),
                                                ("bf16-gqa-2x2", "bf16", 3.5e-2),
                                                ("fp16-1x4", "fp16", 5e-3)])
def test_low_precision_layout_passes_against_no_cp_in_the_same_dtype(low_precision, trial,
                                                                      dtype, tol):
    res = low_precision[trial]
    assert res.status == Status.OK, f"{res.error} (log {res.log_path})"
    num = res.verification["numerics"]
    assert num["passed"] and num["dtype"] == dtype and num["tolerance"] == tol
    assert num["reference"] == f"no-CP {dtype}" and num["metric"].startswith("max(|cp - nocp|")
    assert max(num["errors"].values()) <= tol
    assert res.qkv_format == "bshd" and res.te_backend == ""  # the torch reference


@pytest.mark.multiproc
def test_planted_cp_off_is_caught_by_the_same_dtype_proof(low_precision):
    res = low_precision["bf16-cp-off"]
    assert res.status == Status.INVALID and res.failure_class == FailureClass.NUMERICS
    assert res.error.startswith("CP result differs from single-process attention")
    assert min(res.verification["numerics"]["errors"].values()) > 0.1  # far beyond 2.5e-2
    assert res.step_times_s == []


@pytest.mark.parametrize("scale", [0.0, 0.5, 0.99, 1.01, 3.0])
def test_excess_error_passes_exactly_when_assert_close_does(scale):
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(4, 8, 2, 4, generator=g)
    tol = 2.5e-2
    bound = tol + tol * ref.abs()  # assert_close's allowance, elementwise
    got = ref + scale * bound * torch.sign(torch.randn(ref.shape, generator=g))
    try:
        torch.testing.assert_close(got, ref, atol=tol, rtol=tol)
        closes = True
    except AssertionError:
        closes = False
    assert (verify.excess_err(got, ref, tol) <= tol) is closes
    assert closes is (scale <= 1.0)


def test_formats_round_trip_and_sbhd_puts_sequence_first():
    x = torch.arange(2 * 6 * 3 * 4.0).view(2, 6, 3, 4)  # bshd
    s = verify.to_format(x, "sbhd")
    assert s.shape == (6, 2, 3, 4) and s.is_contiguous()
    assert torch.equal(verify.from_format(s, "sbhd"), x)
    assert verify.to_format(x, "bshd") is x


def test_sbhd_attention_run_equals_bshd():
    """``verify._run`` feeds an sbhd layer sbhd tensors and reads its results back as bshd."""
    class SbhdAttention:
        qkv_format = "sbhd"

        def __call__(self, q, k, v):  # what TE's sbhd layer computes, on [s, b, h, d]
            t = [x.transpose(0, 1) for x in (q, k, v)]
            return verify.full_causal_attention(*t).transpose(0, 1)

    spec = make_spec(Layout(1, 1), seq=16)
    ins = verify.make_inputs(spec, 16, seed=3)
    a = verify._run(SbhdAttention(), ins, "sbhd", "cpu", torch.float32)
    b = verify._run(verify.full_causal_attention, ins, "bshd", "cpu", torch.float32)
    assert all(torch.allclose(a[n], b[n], atol=1e-6) for n in ("out", "dq", "dk", "dv"))


@pytest.mark.parametrize("line, name", [
    ("Selected backend = FusedAttention (sub-backend 1).", "FusedAttention (sub-backend 1)"),
    ("Selected backend = FlashAttention (2.7.4.post1)", "FlashAttention (2.7.4.post1)"),
    ("[DEBUG    | DotProductAttention]: Selected backend = UnfusedDotProductAttention.",
     "UnfusedDotProductAttention"),
    ("Selected backend = NoBackend.", "NoBackend"),
    ("Available backends = {FlashAttention=False, FusedAttention=True}", None),
])
def test_te_selected_backend_line_is_parsed(line, name):
    assert parse_selected_backend(line) == name


def test_backend_log_captures_te_s_logger_at_debug():
    logger = logging.getLogger(TE_LOGGER)
    old = logger.level
    log = BackendLog().attach()
    try:
        logger.setLevel(logging.DEBUG)  # what TE does with NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2
        logger.debug("Disabling FlashAttention 2 for compute capability < sm80")
        logger.debug("Selected backend = %s.", "FusedAttention (sub-backend 1)")
        logger.debug("Selected backend = %s", "FlashAttention (2.7.4)")
        assert log.selected == ["FusedAttention (sub-backend 1)", "FlashAttention (2.7.4)"]
        assert log.last == "FlashAttention (2.7.4)"
    finally:
        log.detach()
        logger.setLevel(old)
    assert log not in logger.handlers


def test_results_written_before_the_new_fields_still_read():
    old = {"trial_id": "t", "status": "ok", "failure_class": None, "error": None,
           "step_times_s": [0.1], "median_s": 0.1, "p10_s": 0.1, "p90_s": 0.1,
           "peak_mem_bytes": 0, "mem_note": "", "tflops_per_gpu": 1.0,
           "flops_per_gpu_step": 1e9, "verification": {}, "fingerprint": {}, "backend": "te",
           "world_size": 4, "log_path": None, "job_id": None, "wall_s": 1.0}
    res = result_from_json(json.dumps(old))
    assert res.te_backend == "" and res.qkv_format == "" and res.notes == []
    assert res.resources == {}


def test_new_fields_round_trip():
    res = TrialResult(trial_id="t", status=Status.OK, te_backend="FusedAttention (sub-backend 1)",
                      qkv_format="sbhd", notes=["n"], resources={"open_fds": 3})
    assert result_from_json(to_json(res)) == res
    spec = make_spec(Layout(2, 2), qkv_format="bshd")
    assert spec_from_json(to_json(spec)).qkv_format == "bshd"
    assert make_spec(Layout(2, 2)).qkv_format == "sbhd"  # Megatron-Core's training layout


def test_te_backend_format_and_notes_reach_the_trial_row():
    from hcp_tune.store.folder import SweepKey, trial_row

    key = SweepKey(cluster="dgx-h100", model="llama3-8b", tp=1, cp=4, seq=16384,
                   runner="attention", env_tag="te-2.17")
    res = TrialResult(trial_id="t", status=Status.OK, backend="te", qkv_format="sbhd",
                      te_backend="FusedAttention (sub-backend 1)", notes=["a", "b"])
    row = trial_row(key, make_spec(Layout(2, 2)), res)
    assert (row["te_backend"], row["qkv_format"], row["notes"]) == (
        "FusedAttention (sub-backend 1)", "sbhd", "a; b")


def test_each_te_layer_records_only_its_own_selection_and_leaves_no_handler():
    """TEAttention listens to TE's logger only during its own forward (no TE here: the
    layer inside is a stand-in that logs the way TE's backend selection does)."""
    from hcp_tune.job.attention.te import TEAttention

    class LoggingLayer:
        def __init__(self, name):
            self.name = name

        def __call__(self, q, k, v):
            logging.getLogger(TE_LOGGER).debug("Selected backend = %s.", self.name)
            return q.flatten(2)

    logger = logging.getLogger(TE_LOGGER)
    old, handlers = logger.level, list(logger.handlers)
    logger.setLevel(logging.DEBUG)
    try:
        layers = {}
        for name in ("FusedAttention (sub-backend 1)", "FlashAttention (2.7.4)"):
            att = TEAttention.__new__(TEAttention)  # skips __init__, which imports TE
            att.heads, att.head_dim, att.qkv_format = 2, 4, "sbhd"
            att.log, att.layer = BackendLog(), LoggingLayer(name)
            att._cache, att._fresh = None, False
            layers[name] = att
        x = torch.zeros(3, 1, 2, 4)
        for att in layers.values():
            assert att(x, x, x).shape == x.shape
        assert {n: a.selected_backend for n, a in layers.items()} == {n: n for n in layers}
        assert logger.handlers == handlers
    finally:
        logger.setLevel(old)


class CachingLayer:
    """Stands in for TE's DotProductAttention: it selects (and logs) its backend only when
    TE's cache asks for it, as TE does for a repeat of the same shapes."""

    def __init__(self, cache, name):
        self.cache, self.name = cache, name

    def __call__(self, q, k, v):
        if self.cache["backend_selection_requires_update"] or self.cache["attention_params"] is None:
            logging.getLogger(TE_LOGGER).debug("Selected backend = %s.", self.name)
            self.cache.update(attention_params=tuple(q.shape), use_fused_attention=True,
                              fused_attention_backend=1, backend_selection_requires_update=False)
        return q.flatten(2)


def test_a_repeat_trial_of_the_same_shapes_records_its_backend():
    """issue 19: the second trial in the same processes found TE's cached choice and logged
    nothing, so its te_backend was recorded empty (fails on 3d093ac)."""
    from hcp_tune.job.attention.te import TEAttention

    cache = {"attention_params": None, "use_flash_attention": None, "use_fused_attention": None,
             "fused_attention_backend": None, "use_unfused_attention": None,
             "backend_selection_requires_update": False}
    logger = logging.getLogger(TE_LOGGER)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        got = []
        for _ in range(2):  # two trials, each with its own layer, in the same process
            att = TEAttention.__new__(TEAttention)  # skips __init__, which imports TE
            att.heads, att.head_dim, att.qkv_format = 2, 4, "sbhd"
            att.log, att.layer = BackendLog(), CachingLayer(cache, "FusedAttention (sub-backend 1)")
            att._cache, att._fresh = cache, False
            x = torch.zeros(3, 1, 2, 4)
            att(x, x, x)
            got.append(att.selected_backend)
        assert got == ["FusedAttention (sub-backend 1)"] * 2
    finally:
        logger.setLevel(old)


@pytest.mark.parametrize("cache,name", [
    ({"use_flash_attention": True, "flash_attention_backend": "2.7.4"}, "FlashAttention (2.7.4)"),
    ({"use_fused_attention": True, "fused_attention_backend": 1}, "FusedAttention (sub-backend 1)"),
    ({"use_unfused_attention": True}, "UnfusedDotProductAttention"),
    ({}, ""), (None, ""),
])
def test_te_backend_is_read_from_te_s_cache_when_the_log_is_silent(cache, name):
    from hcp_tune.job.attention.te import backend_from_cache

    assert backend_from_cache(cache) == name


def test_backend_log_is_on_te_s_logger_before_te_builds_its_layer():
    """TE adds its own stderr handler at construction when its logger has none: every rank
    then dumped TE's debug config. BackendLog is attached first (fails on 3d093ac)."""
    from hcp_tune.job.attention.te import build_with_log

    logger = logging.getLogger(TE_LOGGER)
    before = list(logger.handlers)
    log = BackendLog()

    def construct_like_te():
        if not logger.handlers:  # what TE does at construction
            logger.addHandler(logging.StreamHandler())
        return [h for h in logger.handlers]

    seen = build_with_log(log, construct_like_te)
    assert log in seen and logger.handlers == before  # ours was there; none added, none left
