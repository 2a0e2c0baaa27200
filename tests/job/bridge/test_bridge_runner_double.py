"""``job.bridge.runner`` end to end on CPU: ``run_bridge_trial`` with the test double of
Bridge's ``pretrain`` (pretrain_double.py, its protocol from the pinned source's extract),
four gloo processes running thirteen trials one after another: a measured a2a+p2p run, a
planted wrong ``cp_group`` on one module (invalid), the stop file (pruned), the time limit
(failed, time_limit), pp=2 with two micro-batches per step, dp=2 with three (issue 30: the
double counts global / (micro * dp)), and two misconfigurations the double does not build
in, given as overrides: ``cp_comm_type=p2p`` on an a2a+p2p trial (the guard catches it)
and null hierarchical sizes (Bridge's validation, restated in the double, refuses it),
and ranks reporting a cyclic placement over two hosts (the placement check fails it);
packed documents (issue 37) at [2,2] and [1,4], proven THD and CP in the first forwards, and
a stack that loses the cu_seqlens or turns CP off in forward (invalid). Then eight
processes: a2a+p2p [2,2] at tp=2, and at pp=2 (the default job's shape, issue 38),
with CUDA_DEVICE_MAX_CONNECTIONS and GC checked as the double saw them inside ``pretrain``.

Nothing here is a GPU result: the double checks the runner's control flow, the CP proof on
the modules, the memory readings' CPU fallback, the stop flag and the failure classes.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import make_spec

from hcp_tune.job.dist import quiet_ports
from hcp_tune.space.layout import Layout, rank_groups
from hcp_tune.spec import Status, result_from_json

DOUBLE = Path(__file__).with_name("pretrain_double.py")
WORLD = 4
TE_LINE = "Selected backend = FusedAttention (sub-backend 1)"
# three documents of seq=64 at cp=4 (each padded to 8: 16 + 24 + 16 = 56, an 8-token tail)
PACKED = {"packing": "thd", "packed_docs": [[13, 20, 9]], "mix": "doc3#abcdef"}
NCCL_LINE = "node0:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"


def _spec(name: str, layout: Layout, *, tp: int = 1, pp: int = 1, dp: int = 1, tmp: Path, **kw):
    spec = make_spec(layout, seq=64, runner="bridge", trial_id=name, tp=tp, pp=pp, dp=dp,
                     layers=2 * pp, ffn_hidden=64, expected_groups=rank_groups(
                         layout, tp=tp, dp=dp, pp=pp, gpus_per_node=8).as_dict(),
                     progress_path=str(tmp / f"{name}.jsonl"), stop_path=str(tmp / f"{name}.stop"),
                     **kw)
    return json.loads(json.dumps(dataclasses.asdict(spec)))


def _launch(tmp: Path, scenarios: list, world: int) -> dict:
    """Every scenario in turn on ``world`` gloo ranks (forked by the double after its
    imports); rank 0's results by name."""
    (tmp / "scenarios.json").write_text(json.dumps(scenarios))
    # one port a scenario, all quiet now and below the ephemeral range: a neighbour of a
    # bind-to-0 port taken by the other lane's gloo pairs left ranks waiting 300 s (CI, 3.12)
    ports = quiet_ports(n=len(scenarios))
    env = {**os.environ, "WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ports),
           "TMPDIR": str(tmp)}  # where the runner asks NCCL to log (no HCP_TUNE_LOG here)
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)  # what the runner sets is what is checked
    proc = subprocess.Popen([sys.executable, str(DOUBLE), str(world), str(tmp / "scenarios.json"),
                             str(tmp)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:  # the ranks are in its process group
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, log[-4000:]
    return {sc["name"]: result_from_json((tmp / f"{sc['name']}.rank0.json").read_text())
            for sc in scenarios} | {"_logs": [log], "_tmp": tmp}


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("double")
    (tmp / "stop.stop").write_text("early stop: slower than [1,4] by 40%")
    scenarios = [
        {"name": "ok", "spec": _spec("ok", Layout(2, 2), tmp=tmp),
         "double": {"te_log_line": TE_LINE}},
        {"name": "planted", "spec": _spec("planted", Layout(2, 2), tmp=tmp),
         "double": {"plant_wrong_group": True}},
        {"name": "stop", "spec": _spec("stop", Layout(2, 2), tmp=tmp)},
        {"name": "limit", "spec": _spec("limit", Layout(2, 2), tmp=tmp, time_limit_s=1e-3)},
        {"name": "pp2", "spec": _spec("pp2", Layout(1, 2), pp=2, tmp=tmp, micro_batches=2)},
        {"name": "dp2", "spec": _spec("dp2", Layout(1, 2), dp=2, tmp=tmp, micro_batches=3)},
        {"name": "comm_p2p", "spec": _spec("comm_p2p", Layout(2, 2), tmp=tmp, bridge_overrides=[
            "model.cp_comm_type=p2p"])},
        {"name": "null_sizes", "spec": _spec("null_sizes", Layout(2, 2), tmp=tmp, bridge_overrides=[
            "model.hierarchical_context_parallel_sizes=null"])},
        {"name": "cyclic", "spec": _spec("cyclic", Layout(2, 2), tmp=tmp),
         "double": {"cyclic_hosts": True}},
        # packed (issue 37): the trial's documents through the runner's packed data
        {"name": "packed", "spec": _spec("packed", Layout(2, 2), tmp=tmp, **PACKED)},
        {"name": "packed_p2p", "spec": _spec("packed_p2p", Layout(1, 4), tmp=tmp, **PACKED)},
        {"name": "packed_drop", "spec": _spec("packed_drop", Layout(2, 2), tmp=tmp, **PACKED),
         "double": {"packed": "drop"}},
        {"name": "packed_cp_off", "spec": _spec("packed_cp_off", Layout(2, 2), tmp=tmp,
                                                **PACKED), "double": {"packed": "cp_off"}},
    ]
    return _launch(tmp, scenarios, WORLD)


@pytest.fixture(scope="module")
def ran8(tmp_path_factory) -> dict:
    """issue 38: the default job's shape (a2a+p2p with tp > 1, and with pp > 1) on 8 ranks."""
    tmp = tmp_path_factory.mktemp("double8")
    scenarios = [
        {"name": "tp2", "spec": _spec("tp2", Layout(2, 2), tp=2, tmp=tmp),
         "double": {"nccl_log_line": NCCL_LINE}},
        {"name": "pp2cp4", "spec": _spec("pp2cp4", Layout(2, 2), pp=2, tmp=tmp,
                                         micro_batches=2)},
    ]
    return _launch(tmp, scenarios, 8)


@pytest.mark.multiproc
def test_the_double_drives_the_runner_to_a_verified_measurement(ran):
    res = ran["ok"]
    assert res.status == Status.OK, res.error
    assert res.verification["cp_active"]["checked"] and not res.verification["cp_active"]["problems"]
    assert len(res.step_times_s) == 2 and res.median_s > 0  # measure_steps=2 after 1 warm-up
    assert len(res.verification["lm_loss"]) == 3 and all(res.verification["lm_loss"])
    # memory: the CPU fallback (peak RSS) of every rank, gathered at on_train_end
    assert [m["rank"] for m in res.verification["memory"]] == list(range(WORLD))
    assert res.peak_mem_bytes > 0 and "ru_maxrss" in res.mem_note
    assert res.flops_per_gpu_step > 0 and res.tflops_per_gpu > 0  # the double's FLOP counter
    assert res.fingerprint["hosts"] and res.te_backend == TE_LINE.split(" = ")[1]
    fields = res.verification["bridge_config"]
    assert fields["model.hierarchical_context_parallel_sizes"] == [2, 2]
    # issue 30: scratch mode's recipe environment and fusions, recorded with the trial
    parity = res.fingerprint["bridge_recipe_parity"]
    assert parity["mode"] == "scratch" and parity["env_vars"]["NCCL_NVLS_ENABLE"] == 0
    assert any(n.startswith("scratch mode: the Llama recipes' environment and fusions applied "
                            "except model.rotary_base") for n in res.notes)
    assert res.verification["host_peak_rss_bytes"] > 0
    progress = (ran["_tmp"] / "ok.jsonl").read_text().splitlines()
    assert len(progress) == 2  # rank 0's measured steps, for early stopping


@pytest.mark.multiproc
def test_a_planted_wrong_cp_group_on_one_module_is_invalid(ran):
    res = ran["planted"]
    assert res.status == Status.INVALID
    assert "rank 0: chunk0.blocks.0's CP groups" in res.error
    assert "differ from the plan" in res.error


@pytest.mark.multiproc
def test_the_stop_file_ends_the_bridge_loop_cleanly_as_pruned(ran):
    res = ran["stop"]
    assert res.status == Status.PRUNED and res.error == "early stop: slower than [1,4] by 40%"
    assert len(res.verification["lm_loss"]) == 1  # the step begun ran; on_train_end fired
    assert len(res.verification["memory"]) == WORLD


@pytest.mark.multiproc
def test_the_time_limit_ends_the_bridge_loop_as_time_limit(ran):
    res = ran["limit"]
    assert res.status == Status.FAILED and res.failure_class.value == "time_limit"
    assert "runner.time_limit_s=0.001 reached at Bridge step 0" in res.error


@pytest.mark.multiproc
def test_the_whole_world_runs_with_pipeline_stages_and_micro_batches(ran):
    res = ran["pp2"]
    assert res.status == Status.OK, res.error
    fields = res.verification["bridge_config"]
    assert fields["model.pipeline_model_parallel_size"] == 2
    assert fields["train.global_batch_size"] == 2  # mbs 1 * dp 1 * 2 micro-batches
    assert res.world_size == WORLD


def _seen(ran, name: str, rank: int = 0) -> dict:
    return json.loads((ran["_tmp"] / f"{name}.double.rank{rank}.json").read_text())


@pytest.mark.multiproc
def test_the_runners_mock_data_builds_no_seq_by_seq_mask(ran):
    """issue 30: without create_attention_mask=False Megatron-Core's mock data builds an
    S x S mask per sample (16 GiB at 128K); the double builds it as Megatron-Core does."""
    assert ran["ok"].status == Status.OK
    assert all(_seen(ran, "ok", r)["mask_bytes"] == 0 for r in range(WORLD))


@pytest.mark.multiproc
def test_a_step_runs_global_over_micro_times_dp_micro_batches(ran):
    res = ran["dp2"]
    assert res.status == Status.OK, res.error
    assert res.verification["bridge_config"]["train.global_batch_size"] == 6  # 1 * 2 * 3
    assert set(_seen(ran, "dp2")["micro_batches"]) == {3}  # not 6: dp has its place


@pytest.mark.multiproc
def test_a_comm_type_override_that_is_not_the_plans_is_caught_by_the_guard(ran):
    res = ran["comm_p2p"]
    assert res.status == Status.INVALID
    assert "has cp_comm_type='p2p', expected 'a2a+p2p'" in res.error


@pytest.mark.multiproc
def test_null_hierarchical_sizes_are_refused_by_bridges_validation(ran):
    res = ran["null_sizes"]
    assert res.status == Status.FAILED
    assert "hierarchical_context_parallel_sizes must be set" in res.error


@pytest.mark.multiproc
def test_scratch_mode_trains_with_automatic_gc_off(ran):
    """issue 38: Bridge's loop disables GC when train.manual_gc (the recipes' setting); with
    it on, a collection on one rank inside a timed step stalls the others."""
    assert ran["ok"].status == Status.OK
    seen = [_seen(ran, "ok", r)["gc_enabled_in_steps"] for r in range(WORLD)]
    assert all(steps and not any(steps) for steps in seen)
    assert ran["ok"].fingerprint["bridge_recipe_parity"]["gc"]["train.manual_gc"] is True


@pytest.mark.multiproc
def test_a_cyclic_placement_fails_the_trial_before_a_step_is_timed(ran):
    res = ran["cyclic"]
    assert res.status == Status.FAILED and res.failure_class.value == "environment"
    assert res.error.startswith("PlacementError: rank placement: ranks must fill one node after "
                                "another (srun --distribution=block)")
    assert not res.step_times_s
    assert res.verification["placement"]["problems"][0].startswith(
        "a2a group [0, 1] is planned on one node (2 tasks per node")
    assert res.verification["placement"]["rank_hosts"] == ["node0", "node1"] * 2
    assert ran["ok"].verification["placement"]["block"] is True
    assert ran["ok"].fingerprint["rank_nodes"] == [0] * WORLD


@pytest.mark.multiproc
@pytest.mark.parametrize("name,tp,pp,m", [("tp2", 2, 1, 1), ("pp2cp4", 1, 2, 2)])
def test_a2a_p2p_with_tp_or_pp_is_proven_and_measured(ran8, name, tp, pp, m):
    res = ran8[name]
    assert res.status == Status.OK, res.error
    cp = res.verification["cp_active"]
    assert cp["checked"] and not cp["problems"]
    fields = res.verification["bridge_config"]
    assert (fields["model.tensor_model_parallel_size"], fields["model.pipeline_model_parallel_size"],
            fields["model.hierarchical_context_parallel_sizes"]) == (tp, pp, [2, 2])
    assert res.world_size == 8 and len(res.verification["memory"]) == 8
    # CUDA_DEVICE_MAX_CONNECTIONS=1 before CUDA (the double says Hopper), and keyed by
    assert res.fingerprint["settings"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert {_seen(ran8, name, r)["max_connections"] for r in range(8)} == {"1"}
    assert set(_seen(ran8, name)["micro_batches"]) == {m}
    # NCCL's transports from the INIT log the runner asked for (the double writes the line)
    assert res.fingerprint["nccl_transport"] == (["P2P/CUMEM"] if name == "tp2" else None)


def _packed_params_have_pad_between_seqs() -> bool:
    from megatron.core.packed_seq_params import PackedSeqParams
    return "pad_between_seqs" in {f.name for f in dataclasses.fields(PackedSeqParams)}


@pytest.mark.multiproc
@pytest.mark.parametrize("name", ["packed", "packed_p2p"])
def test_a_packed_trial_proves_thd_and_cp_in_its_first_forwards(ran, name):
    res = ran[name]
    assert res.status == Status.OK, res.error
    thd = res.verification["thd"]
    assert thd["checked"] and thd["problems"] == []
    assert thd["modules"] == 2 * WORLD and thd["qkv_format"] == ["thd"]  # every module, rank
    assert thd["documents"] == ["4"]  # three documents and the tail entry (Bridge's packer)
    assert thd["padded_is_unpadded"] == ["False"]  # Bridge's separate padded tensor
    # Megatron-Core 0.16.1 (the 3.11 lane) has no PackedSeqParams.pad_between_seqs, so it
    # stays None; 0.17 on (the 3.12 lane's 0.19, the container's) has it, and the probe fills True
    filled = _packed_params_have_pad_between_seqs()
    assert res.fingerprint["packed"] == {"pad_between_seqs": [str(True if filled else None)],
                                         "pad_between_seqs_set_here": filled,
                                         "padded_is_unpadded": ["False"]}
    seen = json.loads((ran["_tmp"] / f"{name}.double.rank0.json").read_text())
    assert seen["packed_batches"] == 3  # one packed sequence per micro-batch, 3 steps
    cfg = res.verification["bridge_config"]["dataset"]
    assert cfg["_target_"] == "hcp_tune.job.bridge.packed_data:packed_provider"
    assert cfg["packed_docs"] == [[13, 20, 9]] and cfg["enable_offline_packing"] is True


@pytest.mark.multiproc
@pytest.mark.parametrize("name,message", [
    ("packed_drop", "ran without packed_seq_params: the batch's cu_seqlens did not reach"),
    ("packed_cp_off", "packed_seq_params turned CP off in forward"),
])
def test_a_packed_trial_whose_attention_lost_thd_or_cp_is_invalid(ran, name, message):
    res = ran[name]
    assert res.status == Status.INVALID and message in res.error, res.error
    assert res.verification["cp_active"]["problems"] == []  # train start saw nothing wrong
    assert res.verification["thd"]["checked"] and res.verification["thd"]["problems"]
