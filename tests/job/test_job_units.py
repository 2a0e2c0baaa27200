"""Job-side pieces that need no process group: env detection, chunk placement, the local
attention blocks, statistics, FLOPs, the TE path's availability and version rules."""

import pytest
import torch

from hcp_tune.job import bench
from hcp_tune.job import dist as jdist
from hcp_tune.job.attention import verify
from hcp_tune.job.attention.reference import RefHCPAttention
from hcp_tune.job.attention.te import te_min_version_ok, te_unavailable_reason
from hcp_tune.job.trial import run_trial
from hcp_tune.spec import FailureClass, Status, TrialSpec


def test_submitit_local_env_is_read(monkeypatch):
    """The local executor's tasks: rank and world from submitit's JobEnvironment, loopback
    master, the port derived from the job id (the controller's pid) like a SLURM job's."""
    for k, v in {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_JOB_ID": "2950",
                 "SUBMITIT_LOCAL_NTASKS": "4", "SUBMITIT_LOCAL_GLOBALID": "3",
                 "SUBMITIT_LOCAL_LOCALID": "3", "SUBMITIT_LOCAL_NODEID": "0",
                 "SUBMITIT_LOCAL_JOB_NUM_NODES": "1"}.items():
        monkeypatch.setenv(k, v)
    env = jdist.detect_env()
    assert (env.source, env.rank, env.local_rank, env.world_size, env.job_id) == \
        ("local", 3, 3, 4, "2950")
    assert (env.master_addr, env.master_port) == ("127.0.0.1", jdist.job_port("2950"))


def test_torchrun_env_is_read():
    env = jdist.detect_env({"TORCHELASTIC_RUN_ID": "x", "RANK": "5", "LOCAL_RANK": "1",
                            "WORLD_SIZE": "8", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"})
    assert (env.source, env.rank, env.local_rank, env.master_addr) == ("torchrun", 5, 1, "node0")


def test_slurm_env_is_read_through_submitit(monkeypatch):
    for k, v in {"SLURM_JOB_ID": "4242", "SLURM_PROCID": "9", "SLURM_LOCALID": "1",
                 "SLURM_NTASKS": "16", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1",
                 "SLURM_JOB_NODELIST": "gpu[07-08]"}.items():
        monkeypatch.setenv(k, v)
    for k in ("RANK", "WORLD_SIZE", "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(k, raising=False)
    env = jdist.detect_env()
    assert (env.source, env.rank, env.local_rank, env.world_size) == ("slurm", 9, 1, 16)
    assert env.master_addr == "gpu07" and env.hosts == ("gpu07", "gpu08")
    assert env.master_port == jdist.job_port("4242") == 20000 + 4242


def test_job_port_is_derived_from_the_job_id_alike_for_array_jobs():
    assert jdist.job_port("123_4") == 20000 + 1234
    assert 20000 <= jdist.job_port("987654321") < 32000  # below the ephemeral ports


def test_quiet_ports_skip_a_block_with_a_held_port():
    """The double's trials each take a port of one block (CI: a bind-to-0 block's neighbour
    was held by another lane's gloo pair, and the ranks waited 300 s on it)."""
    import socket

    offset = 5000
    with socket.socket() as held:
        held.bind(("127.0.0.1", jdist.JOB_PORT_BASE + offset + 2))
        held.listen()
        first = jdist.quiet_ports(offset, 4)
    assert jdist.JOB_PORT_BASE + offset + 2 not in range(first, first + 4)
    assert jdist.JOB_PORT_BASE <= first < jdist.JOB_PORT_BASE + jdist.JOB_PORT_SPAN


def test_no_launcher_is_a_single_process():
    env = jdist.detect_env({})
    assert (env.source, env.rank, env.world_size) == ("single", 0, 1)


@pytest.mark.parametrize("cp", [1, 2, 4, 8])
def test_load_balanced_placement_round_trips(cp):
    x = torch.arange(2 * cp * 3).view(1, -1, 1, 1)
    pieces = [verify.load_balanced(x, cp, pos) for pos in range(cp)]
    assert pieces[0].flatten()[:3].tolist() == [0, 1, 2]
    assert pieces[0].flatten()[3:].tolist() == list(range(2 * cp * 3 - 3, 2 * cp * 3))
    assert torch.equal(verify.undo_load_balance(pieces, cp), x)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_local_blocks_equal_full_attention_forward_and_backward(kv_heads):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 16, 4, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 16, kv_heads, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 16, kv_heads, 8, generator=g, dtype=torch.float64, requires_grad=True)
    dout = torch.randn(2, 16, 4, 8, generator=g, dtype=torch.float64)
    out = RefHCPAttention()(q, k, v)  # no CP: the two local chunks, causal
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = verify.full_causal_attention(q, k, v)
    ref_grads = torch.autograd.grad(ref, (q, k, v), dout)
    assert verify.rel_err(out, ref) < 1e-12
    assert all(verify.rel_err(a, b) < 1e-12 for a, b in zip(grads, ref_grads))


def test_odd_local_sequence_is_rejected_with_the_rule():
    x = torch.zeros(1, 3, 2, 4)
    with pytest.raises(ValueError, match=r"per-rank sequence 3 must be even \(two chunks\)"):
        RefHCPAttention()(x, x, x)


def test_percentiles_interpolate_like_numpy():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert bench.summarize(xs) == {"median_s": 2.5, "p10_s": 1.3, "p90_s": pytest.approx(3.7),
                                   "steps": 4}


def test_causal_flops_follow_the_stated_convention():
    f = bench.attention_flops(seq=4096, heads=32, head_dim=128, mbs=1)
    assert f["forward"] == 4 * 4096**2 * 32 * 128 / 2
    assert f["backward"] == 2.5 * f["forward"] and f["total"] == 3.5 * f["forward"]


@pytest.mark.parametrize("dtype, gqa, tol", [("fp32", False, 1e-5), ("bf16", False, 2.5e-2),
                                              ("bf16", True, 3.5e-2), ("fp16", False, 5e-3)])
def test_tolerances_are_te_s_own(dtype, gqa, tol):
    assert verify.tolerance(dtype, gqa) == tol


@pytest.mark.parametrize("text, ok", [("1.12.0", True), ("2.9.0.dev0+abc", True),
                                      ("2.17.1+4329ff8", True), ("1.12.0rc1", False),
                                      ("1.11.0+cu12", False), ("0.9", False),
                                      ("not-a-version", False)])
def test_te_minimum_version_is_1_12(text, ok):
    assert te_min_version_ok(text) is ok


def test_te_requested_without_cuda_or_te_is_an_environment_failure():
    reason = te_unavailable_reason()
    if reason is None:
        pytest.skip("CUDA and TE >= 1.12 are present: this is the failure path for their absence")
    spec = TrialSpec(trial_id="te-missing", a2a=1, p2p=1, seq=16, heads=8, kv_heads=8,
                     head_dim=8, backend="te")
    res = run_trial(spec, env=jdist.DistEnv(0, 0, 1, "127.0.0.1", jdist.free_port(), "single"))
    assert res.status == Status.FAILED and res.failure_class == FailureClass.ENVIRONMENT
    assert res.error == f"EnvironmentProblem: backend=te requested, but {reason}"


def test_te_attention_on_hierarchical_groups(tmp_path):
    """The TE path end to end: needs CUDA, TE >= 1.12 and 4 GPUs."""
    reason = te_unavailable_reason()
    if reason is None and torch.cuda.device_count() < 4:
        reason = f"{torch.cuda.device_count()} GPUs visible, the [2,2] layout needs 4"
    if reason:
        pytest.skip(f"TE path not testable here: {reason}")
    from helpers import make_spec

    from hcp_tune.engine.launch import run_local
    from hcp_tune.space.layout import Layout

    spec = make_spec(Layout(2, 2), seq=1024, backend="te", dtype="bf16", warmup_steps=2,
                     measure_steps=3)
    res = run_local(spec, workdir=tmp_path)
    assert res.status == Status.OK, f"{res.error} (log {res.log_path})"
    assert res.backend == "te" and res.verification["numerics"]["tolerance"] == 2.5e-2
    assert res.verification["numerics"]["reference"] == "no-CP bf16"
    assert res.qkv_format == "sbhd" and res.te_backend, res.te_backend  # TE's own report
    assert res.resources["process_groups"] == 1  # only the world group at the start
    assert res.fingerprint["gpu"] and res.fingerprint["transformer_engine"]


def test_gpu_profile_trial_on_a_node_without_cuda_is_an_environment_failure():
    import torch

    from hcp_tune.job.backend import choose_backend
    from hcp_tune.job.failures import EnvironmentProblem, classify
    from hcp_tune.space.layout import Layout
    from hcp_tune.spec import FailureClass

    if torch.cuda.is_available():
        pytest.skip("this node has CUDA: the failure cannot happen here")
    from helpers import make_spec

    spec = make_spec(Layout(2, 2), device="cuda")
    with pytest.raises(EnvironmentProblem, match="no CUDA device on this node") as err:
        choose_backend(spec, None)
    assert classify(err.value)[0] is FailureClass.ENVIRONMENT
    assert choose_backend(make_spec(Layout(2, 2), device="cpu"), None).name == "torch"


def test_ranks_on_a_node_share_its_cores(monkeypatch):
    import os
    import sys

    from hcp_tune.job import batch
    from hcp_tune.job.dist import DistEnv

    monkeypatch.delitem(sys.modules, "torch", raising=False)  # this process's torch: untouched

    def threads(source, world, hosts, **environ):
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
        for k, v in environ.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
        batch._share_cpus(DistEnv(0, 0, world, "127.0.0.1", 1, source, hosts))
        return os.environ.get("OMP_NUM_THREADS")

    assert threads("slurm", 4, ("n1",)) == "2"  # 4 ranks on one 8-core node
    assert threads("slurm", 4, ("n1", "n2")) == "4"  # 2 ranks per node
    assert threads("local", 16, ("h",)) == "1"  # never 0
    assert threads("slurm", 4, ("n1",), SLURM_CPUS_PER_TASK="3") == "3"  # SLURM's own say
    assert threads("slurm", 4, ("n1",), OMP_NUM_THREADS="5") == "5"  # the user's wins
    assert threads("single", 1, ()) is None  # one process: torch's own default


def test_a_fingerprint_unpickles_without_torch():
    """What a job returns is read by the orchestrator, which must not import torch to
    unpickle it (3 s of every sweep's tail and of every adaptive round's boundary): the
    fingerprint holds builtins only (torch.__version__ is a TorchVersion, a str subclass)."""
    import pickle
    import pickletools
    from types import SimpleNamespace

    import torch

    from hcp_tune.job.backend import fingerprint

    fp = fingerprint(SimpleNamespace(source="slurm"), torch.device("cpu"), hosts=["node-a"])
    globals_ = [arg for op, arg, _ in pickletools.genops(pickle.dumps(fp))
                if op.name in ("GLOBAL", "STACK_GLOBAL", "SHORT_BINUNICODE") and arg
                and "torch" in str(arg) and "." in str(arg)]
    assert fp["torch"] == torch.__version__ and type(fp["torch"]) is str
    assert globals_ == []
