"""The pure-torch a2a+p2p attention on real Megatron-Core groups, many gloo processes.

Every kept layout of the plan (the p2p [1,cp] and a2a [cp,1] baselines included) must give
the single-process result; the trial's own proof records it.
"""
import pytest
from helpers import kept_layouts

from hcp_tune.space.layout import Layout
from hcp_tune.spec import Status

pytestmark = pytest.mark.multiproc

CASES = [  # (batch, model, tp, cp, layout)
    *[("world2", "tiny", 1, 2, lay) for lay in ("1x2", "2x1")],
    *[("world4", "tiny", 1, 4, lay) for lay in ("1x4", "2x2", "4x1")],
    *[("world8", "tiny", 1, 8, lay) for lay in ("1x8", "2x4", "4x2", "8x1")],
    *[("world4", "tiny", 2, 2, lay) for lay in ("1x2", "2x1")],
    ("world4", "tiny-gqa", 1, 4, "2x2"),
]


@pytest.mark.parametrize("cp, seq", [(2, 128), (4, 256), (8, 256)])
def test_plan_keeps_both_baselines_and_all_splits_of_tiny(cp, seq):
    layouts = kept_layouts("tiny", cp=cp, tp=1, seq=seq)
    assert layouts[0] == Layout(1, cp) and layouts[-1] == Layout(cp, 1)
    assert {f"{lay.a2a}x{lay.p2p}" for lay in layouts} == {
        f"{a}x{p}" for b, m, t, c, lay in CASES if c == cp and t == 1 and m == "tiny"
        for a, p in [lay.split("x")]}


@pytest.mark.parametrize("name, model, tp, cp, layout", CASES,
                         ids=[f"{m}-tp{t}-cp{c}-{lay}" for _, m, t, c, lay in CASES])
def test_layout_equals_single_process_attention(batch, name, model, tp, cp, layout):
    spec, res = batch(name)[f"{model}-tp{tp}-cp{cp}-{layout}"]
    where = f"{spec.trial_id}: {res.status.value} {res.error} (log {res.log_path})"
    assert res.status == Status.OK, where
    assert res.backend == "torch" and res.world_size == tp * cp
    groups = res.verification["groups"]
    assert groups["match"] and groups["actual"] == {
        k: sorted(sorted(g) for g in v) for k, v in spec.expected_groups.items()}, where
    num = res.verification["numerics"]
    assert num["passed"] and num["dtype"] == "fp32" and num["tolerance"] == 1e-5, where
    assert max(num["errors"].values()) <= 1e-5, where


@pytest.mark.parametrize("name, model, tp, cp, layout", CASES[:3],
                         ids=[f"cp{c}-{lay}" for _, m, t, c, lay in CASES[:3]])
def test_ok_trial_reports_timing_flops_memory_and_fingerprint(batch, name, model, tp, cp, layout):
    spec, res = batch(name)[f"{model}-tp{tp}-cp{cp}-{layout}"]
    assert len(res.step_times_s) == spec.measure_steps
    assert res.p10_s <= res.median_s <= res.p90_s
    assert res.flops_per_gpu_step == 3.5 * 2 * spec.seq**2 * spec.heads * spec.head_dim / cp
    assert res.tflops_per_gpu == pytest.approx(res.flops_per_gpu_step / res.median_s / 1e12)
    # CPU: not measured (peak RSS only rises within a process: later trials would read 0)
    assert res.peak_mem_bytes is None and res.mem_note.startswith("not measured on CPU")
    fp = res.fingerprint
    assert fp["launcher"] == "local" and fp["torch"] and fp["megatron_core"] and fp["python"]
    assert fp["gpu"] is None and fp["transformer_engine"] is None
