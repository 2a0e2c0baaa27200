"""Every rank binds to its own GPU before anything touches a device (issue 8, item 1).

No GPU here: ``torch.cuda`` is replaced in-process by a recorder that says two GPUs exist,
logs every call in order and refuses tensor creation on CUDA (``torch.cuda._lazy_init`` is
what torch calls before any CUDA tensor is made). A trial runs in this process as rank 3
of a one-process world on gloo, with a GPU profile, until its first CUDA tensor. Anything
that touched a device before ``set_device`` would, on a real node, have put the rank on
GPU 0.
"""
from __future__ import annotations

import pytest
import torch

from hcp_tune.job import dist as jdist
from hcp_tune.job.trial import run_trial
from hcp_tune.spec import FailureClass, Status, TrialSpec

QUERIES = {"is_available", "device_count"}  # ask what exists; bind nothing
REFUSAL = "cuda recorder: no tensor is made on a GPU in this test"


class CudaRecorder:
    """Stands in for ``torch.cuda``'s device calls; ``calls`` is what was called, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, devices: int = 2) -> None:
        self.calls: list[tuple] = []
        self.bound = None
        cuda = torch.cuda

        def log(name, value=None):
            def call(*args, **kwargs):
                self.calls.append((name, *args))
                return value() if callable(value) else value
            return call

        def set_device(index):
            self.calls.append(("set_device", index))
            self.bound = index

        def lazy_init():
            self.calls.append(("tensor_on_cuda",))
            raise RuntimeError(REFUSAL)

        for name, value in {
            "is_available": True, "device_count": devices,
            "current_device": lambda: 0 if self.bound is None else self.bound,
            "get_device_capability": (9, 0), "get_device_name": "recorded GPU",
            "get_device_properties": None, "synchronize": None, "Stream": object,
            "Event": object, "reset_peak_memory_stats": None, "max_memory_allocated": 0,
            "mem_get_info": (0, 0),
        }.items():
            monkeypatch.setattr(cuda, name, log(name, value))
        monkeypatch.setattr(cuda, "set_device", set_device)
        monkeypatch.setattr(cuda, "_lazy_init", lazy_init)
        monkeypatch.setattr(cuda.nccl, "version", log("nccl.version", (2, 21, 5)))
        # the world group: NCCL is not in a CPU build of torch, gloo stands in for it
        monkeypatch.setattr(jdist, "backend_for", lambda device_type: "gloo")

    def touches_before_binding(self) -> list[tuple]:
        out = []
        for call in self.calls:
            if call[0] == "set_device":
                return out
            if call[0] not in QUERIES:
                out.append(call)
        return out


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_rank_binds_its_gpu_before_any_cuda_object(monkeypatch, backend):
    rec = CudaRecorder(monkeypatch, devices=2)
    spec = TrialSpec(trial_id="device-order", a2a=1, p2p=1, seq=16, heads=8, kv_heads=8,
                     head_dim=8, device="cuda", dtype="fp32", backend=backend,
                     comm_timeout_s=30.0)
    env = jdist.DistEnv(rank=0, local_rank=3, world_size=1, master_addr="127.0.0.1",
                        master_port=jdist.free_port(), source="single")
    res = run_trial(spec, env=env)
    names = [c[0] for c in rec.calls]
    assert "set_device" in names, f"never bound to a GPU: {rec.calls}"
    assert rec.touches_before_binding() == [], f"device touched before set_device: {rec.calls}"
    assert rec.calls[names.index("set_device")] == ("set_device", 1)  # local rank 3 % 2 GPUs
    assert {c for c in rec.calls if c[0] == "set_device"} == {("set_device", 1)}
    # the trial went on to make CUDA tensors (where the recorder stops it), so every device
    # call of the start-up (backend choice, world group, fingerprint, groups) was seen
    assert names[-1] == "tensor_on_cuda", rec.calls
    assert res.status == Status.FAILED and REFUSAL in res.error
    assert res.backend == "torch" and res.fingerprint["gpu"] == "recorded GPU"
    if backend == "auto":  # no TE here: the fallback is said in the result
        assert res.notes == ["backend=auto: transformer_engine is not installed (or fails to "
                             "import); the pure-torch reference ran instead (fp32)"]


def test_recorder_sees_a_device_touch_before_binding(monkeypatch):
    """The check can fail: ``current_device()`` first is reported."""
    rec = CudaRecorder(monkeypatch)
    torch.cuda.is_available()
    torch.cuda.current_device()
    torch.cuda.set_device(1)
    assert rec.touches_before_binding() == [("current_device",)]
    with pytest.raises(RuntimeError, match=REFUSAL):
        torch.zeros(1, device="cuda")
    assert rec.calls[-1] == ("tensor_on_cuda",)


def test_bind_device_takes_local_rank_modulo_visible_gpus(monkeypatch):
    rec = CudaRecorder(monkeypatch, devices=4)
    assert jdist.bind_device(6) == 2 and rec.calls[-1] == ("set_device", 2)
    rec = CudaRecorder(monkeypatch, devices=1)  # a task that sees only its own GPU
    assert jdist.bind_device(5) == 0 and rec.calls[-1] == ("set_device", 0)


def test_no_cuda_binds_nothing():
    if torch.cuda.is_available():
        pytest.skip("this node has CUDA")
    assert jdist.bind_device(3) is None


def test_gpu_below_sm80_is_an_environment_failure(monkeypatch):
    rec = CudaRecorder(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (7, 0))
    spec = TrialSpec(trial_id="sm70", a2a=1, p2p=1, seq=16, heads=8, kv_heads=8, head_dim=8,
                     device="cuda", backend="auto")
    env = jdist.DistEnv(0, 1, 1, "127.0.0.1", jdist.free_port(), "single")
    res = run_trial(spec, env=env)
    assert res.status == Status.FAILED and res.failure_class == FailureClass.ENVIRONMENT
    assert res.error == ("EnvironmentProblem: GPU 1 is sm70: Transformer Engine has no "
                         "context-parallel attention backend below sm80")
    assert ("set_device", 1) in rec.calls


@pytest.mark.parametrize("backend, dtype, want", [
    ("auto", "fp32", ("torch", "fp32", "backend=auto with dtype=fp32: TE's CP attention runs "
                      "bf16/fp16 only; the pure-torch reference ran instead")),
    ("auto", "bf16", ("te", "bf16", "")),
    ("torch", "bf16", ("torch", "bf16", "")),  # asked for: proven against no-CP bf16
])
def test_backend_choice_on_a_gpu_with_te(monkeypatch, backend, dtype, want):
    from hcp_tune.job.attention import te as te_attention
    from hcp_tune.job.backend import choose_backend

    CudaRecorder(monkeypatch)
    monkeypatch.setattr(te_attention, "te_unavailable_reason", lambda: None)  # "TE is here"
    spec = TrialSpec(trial_id="b", a2a=2, p2p=2, seq=64, heads=8, kv_heads=8, head_dim=8,
                     device="cuda", backend=backend, dtype=dtype)
    got = choose_backend(spec, 1)
    assert (got.name, got.dtype, got.note) == want and str(got.device) == "cuda:1"


def test_te_with_fp32_is_refused_when_asked_for_explicitly(monkeypatch):
    from hcp_tune.job.attention import te as te_attention
    from hcp_tune.job.backend import choose_backend
    from hcp_tune.job.failures import EnvironmentProblem

    CudaRecorder(monkeypatch)
    monkeypatch.setattr(te_attention, "te_unavailable_reason", lambda: None)
    spec = TrialSpec(trial_id="b", a2a=2, p2p=2, seq=64, heads=8, kv_heads=8, head_dim=8,
                     device="cuda", backend="te", dtype="fp32")
    with pytest.raises(EnvironmentProblem, match="the TE path runs bf16 or fp16, not fp32"):
        choose_backend(spec, 0)


def test_the_bridge_runner_binds_the_gpu_before_importing_bridge(monkeypatch):
    """Importing Megatron-Bridge imports Transformer Engine: the binding must come first."""
    from helpers import make_spec

    from hcp_tune.job import dist
    from hcp_tune.job.bridge import runner
    from hcp_tune.space.layout import Layout

    order = []
    monkeypatch.setattr(dist, "bind_device", lambda local_rank: order.append("bind") or 0)

    def real_stack(spec):
        order.append("import bridge")
        raise ImportError("no Bridge here")
    monkeypatch.setattr(runner, "real_stack", real_stack)
    monkeypatch.setattr(runner, "missing_stack", lambda: None)
    env = dist.DistEnv(rank=0, local_rank=0, world_size=4, master_addr="127.0.0.1",
                       master_port=1, source="torchrun")
    res = runner.run_bridge_trial(make_spec(Layout(2, 2), runner="bridge", ffn_hidden=64),
                                  env=env)
    assert order == ["bind", "import bridge"] and res.failure_class.value == "environment"
