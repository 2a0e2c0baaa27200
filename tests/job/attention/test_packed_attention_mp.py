"""Packed sequences (THD) through real trials: 4 gloo processes, Megatron-Core's groups, the
pure-torch reference attention per document, proven against per-document attention.

Every layout of cp=4 (p2p [1,4], [2,2], a2a [4,1]) runs a mix of uneven documents, one
of them shorter than 2*cp, over two micro-batch sequences; the proof's own stream has every
case a per-document partition meets. A wrong partition (the fixed-length one: load-balanced
chunks of the whole stream) must fail the proof, as must CP switched off.
"""
import dataclasses
import sys

import cloudpickle
import pytest
from helpers import make_spec

from hcp_tune.space.layout import Layout
from hcp_tune.spec import FailureClass, Status

pytestmark = pytest.mark.multiproc

DOCS = [[100, 5, 37, 64, 1], [30, 3, 90]]  # unpadded; 5, 1 and 3 are shorter than 2*cp = 8
LAYOUTS = [Layout(1, 4), Layout(2, 2), Layout(4, 1)]


def packed(layout, trial_id, **kw):
    return make_spec(layout, seq=256, mbs=2, packing="thd", packed_docs=DOCS, mix="test#000000",
                     trial_id=trial_id, **kw)


@pytest.fixture(scope="module")
def trials(tmp_path_factory):
    from hcp_tune.engine.launch import run_local_batch

    specs = [packed(lay, f"packed-{lay.a2a}x{lay.p2p}") for lay in LAYOUTS] + [
        packed(Layout(2, 2), "packed-gqa-2x2", model="tiny-gqa"),
        packed(Layout(2, 2), "packed-bf16-2x2", backend="torch", dtype="bf16"),
        packed(Layout(2, 2), "packed-over-peak", peak_tflops=1e-9),
        packed(Layout(2, 2), "packed-cp-off", inject_fault="cp_off"),
    ]
    results = run_local_batch(specs, workdir=tmp_path_factory.mktemp("packed"))
    return {s.trial_id: (s, r) for s, r in zip(specs, results)}


@pytest.mark.parametrize("trial_id", ["packed-1x4", "packed-2x2", "packed-4x1", "packed-gqa-2x2"])
def test_packed_layout_equals_per_document_attention(trials, trial_id):
    spec, res = trials[trial_id]
    where = f"{trial_id}: {res.status.value} {res.error} (log {res.log_path})"
    assert res.status == Status.OK, where
    assert res.verification["groups"]["match"], where
    num = res.verification["numerics"]
    assert num["passed"] and num["reference"] == "float64 per document", where
    assert max(num["errors"].values()) <= num["tolerance"] == 1e-5, where
    assert any(1 < d < 2 * spec.cp for d in num["docs"]) and 1 in num["docs"]
    assert len(res.step_times_s) == spec.measure_steps


def test_packed_trial_records_its_stream_and_counts_packed_flops(trials):
    spec, res = trials["packed-2x2"]
    docs = [d for seq in DOCS for d in seq]
    rec = res.verification["packing"]
    assert rec["mix"] == "test#000000" and rec["documents"] == len(docs)
    assert rec["real_tokens"] == sum(docs) and rec["tokens"] == sum(-(-d // 8) * 8 for d in docs)
    assert rec["thd"] == {"pad_between_seqs": True, "cu_seqlens_padded_is_unpadded": None}
    assert res.fingerprint["thd"] == rec["thd"]
    # sum(d^2) of the documents, not seq^2 (nor mbs * seq^2)
    assert res.flops_per_gpu_step == 3.5 * 2 * sum(d * d for d in docs) * 8 * 8 / spec.cp
    assert res.tflops_per_gpu == pytest.approx(res.flops_per_gpu_step / res.median_s / 1e12)
    assert "sum(d^2)" in res.verification["flops"]


def test_packed_low_precision_passes_against_packed_attention_without_cp(trials):
    _, res = trials["packed-bf16-2x2"]
    assert res.status == Status.OK, f"{res.error} (log {res.log_path})"
    num = res.verification["numerics"]
    assert num["passed"] and num["reference"] == "no-CP bf16 per document"
    assert max(num["errors"].values()) <= num["tolerance"] == 2.5e-2


def test_packed_trial_beating_the_peak_is_invalid(trials):
    _, res = trials["packed-over-peak"]
    assert res.status == Status.INVALID and "exceeds the hardware peak" in res.error
    assert res.verification["numerics"]["passed"]  # measured, then refused


def test_packed_trial_with_cp_off_fails_the_proof(trials):
    _, res = trials["packed-cp-off"]
    assert res.status == Status.INVALID and res.failure_class == FailureClass.NUMERICS
    assert max(res.verification["numerics"]["errors"].values()) > 1e-2
    assert res.step_times_s == [] and res.tflops_per_gpu is None  # never timed


# ---------------------------------------------------------------- a wrong partition


def trial_with_fixed_length_partition(spec):
    """On every rank: the packed proof handed the fixed-length partition (chunks r and
    2cp-1-r of the whole stream) instead of the per-document one, then the real trial."""
    from hcp_tune.job.attention import packed as job_packed
    from hcp_tune.job.attention import verify
    from hcp_tune.job.trial import run_trial

    job_packed.packed_share = lambda x, stream, pos: verify.load_balanced(x, stream.cp, pos)
    job_packed.packed_unshare = lambda pieces, stream: verify.undo_load_balance(pieces,
                                                                                stream.cp)
    return run_trial(spec)


def test_fixed_length_partition_on_packed_data_fails_numerics(tmp_path):
    from hcp_tune.engine import dispatch
    from hcp_tune.engine.launch import default_executor

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the job has no tests folder
    spec = packed(Layout(2, 2), "packed-fixed-partition")
    cfg = dataclasses.replace(default_executor(), name="local", folder=str(tmp_path),
                              time_limit_min=10)
    ex = dispatch.make_executor(cfg, world_size=spec.world_size, gpus_per_node=0)
    res = dispatch.submit(ex, trial_with_fixed_length_partition, spec).job.results()[0]  # rank 0
    assert res.status == Status.INVALID and res.failure_class == FailureClass.NUMERICS, res.error
    assert "CP result differs from single-process attention" in res.error
    assert max(res.verification["numerics"]["errors"].values()) > 1e-2
