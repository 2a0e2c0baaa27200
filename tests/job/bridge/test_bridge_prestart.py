"""issue 38: what a Bridge trial exports before CUDA starts (the recipes' environment,
CUDA_DEVICE_MAX_CONNECTIONS), the recipe-mode comparison after the build, the placement
check and NCCL's transports. The order is checked on ``runner._run`` itself: the
environment is read at the moment the runner binds the GPU, the first CUDA call."""
import os
from types import SimpleNamespace

import pytest

from hcp_tune.job.bridge import placement, prestart
from hcp_tune.job.bridge import runner as bridge_runner
from hcp_tune.job.bridge.config import bridge_fields
from hcp_tune.job.bridge.parity import RECIPE_ENV_VARS
from hcp_tune.job.dist import DistEnv
from hcp_tune.spec import Status, TrialSpec

HOPPER, BLACKWELL = (9, 0), (10, 0)
RECIPE = "llama3_8b_128k_pretrain_config"


def spec(a2a=2, p2p=2, tp=1, **kw):
    base = dict(trial_id="t", a2a=a2a, p2p=p2p, tp=tp, seq=256, heads=8, kv_heads=8,
                head_dim=8, hidden=64, ffn_hidden=256, layers=2, vocab=1024, runner="bridge")
    return TrialSpec(**{**base, **kw})


@pytest.mark.parametrize("tp,cp,cap,want", [
    (1, 1, HOPPER, False), (2, 1, HOPPER, True), (1, 2, HOPPER, True),
    (2, 4, BLACKWELL, False), (2, 4, None, True),  # unknown GPU: Megatron-LM's pre-Blackwell rule
])
def test_the_connections_variable_follows_megatrons_rule(tp, cp, cap, want):
    assert prestart.connections_needed(tp, cp, cap) is want


def test_scratch_mode_exports_the_configs_env_and_one_connection():
    s = spec(tp=2)
    env = prestart.prestart_env(s, bridge_fields(s), HOPPER)
    assert env == {**{k: str(v) for k, v in RECIPE_ENV_VARS.items()},
                   "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    single = spec(a2a=1, p2p=1)
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in prestart.prestart_env(
        single, bridge_fields(single), HOPPER)


def test_recipe_mode_exports_the_recipes_common_environment():
    s = spec(bridge_recipe=RECIPE)
    f = bridge_fields(s)
    assert "env_vars" not in f  # the recipe keeps its own in the container
    env = prestart.prestart_env(s, f, BLACKWELL)
    assert env == {k: str(v) for k, v in RECIPE_ENV_VARS.items()}


def test_the_users_value_wins_and_is_not_counted_as_exported():
    environ = {"CUDA_DEVICE_MAX_CONNECTIONS": "8", "NCCL_NVLS_ENABLE": "1"}
    done = prestart.export({"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_NVLS_ENABLE": "0",
                            "TORCH_NCCL_HIGH_PRIORITY": "1"}, environ)
    assert done == {"TORCH_NCCL_HIGH_PRIORITY": "1"}
    assert environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "8" and environ["NCCL_NVLS_ENABLE"] == "1"


def test_a_recipe_env_that_differs_from_the_exported_one_is_a_note():
    exported = {k: str(v) for k, v in RECIPE_ENV_VARS.items()}
    environ = dict(exported)
    assert prestart.recipe_env_notes(dict(RECIPE_ENV_VARS), exported, environ) == []
    recipe = {**RECIPE_ENV_VARS, "NCCL_NVLS_ENABLE": 1, "NVTE_FWD_LAYERNORM_SM_MARGIN": 16}
    del recipe["TORCH_NCCL_HIGH_PRIORITY"]
    notes = prestart.recipe_env_notes(recipe, exported, environ)
    assert notes == [
        "recipe env_vars applied only inside pretrain, after CUDA started: "
        "NVTE_FWD_LAYERNORM_SM_MARGIN=16",
        "recipe env_vars differ from what was exported before CUDA (the exported value "
        "stays): NCCL_NVLS_ENABLE: recipe 1, exported 0",
        "exported before CUDA as Bridge's recipes do, but this recipe's env_vars lack: "
        "TORCH_NCCL_HIGH_PRIORITY"]


class _Stop(Exception):
    pass


@pytest.fixture
def run_until_pretrain(monkeypatch):
    """``_run`` up to Bridge's ``pretrain`` on CPU, with the environment each step saw."""
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()
                                        if k not in ("CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_DEBUG")
                                        and not k.startswith(tuple(RECIPE_ENV_VARS))})
    seen: dict = {}
    real_bind = bridge_runner._bind

    def bind(env, *, needs_cuda):
        seen["at_bind"] = dict(os.environ)  # the first CUDA call of a real run
        return real_bind(env, needs_cuda=needs_cuda)

    monkeypatch.setattr(bridge_runner, "_bind", bind)

    def go(s: TrialSpec, recipe_env=None, capability=HOPPER):
        def pretrain(cfg, forward_step, callbacks=None):
            raise _Stop("pretrain reached")

        def build(fields):
            seen["fields"] = fields
            return SimpleNamespace(env_vars=dict(recipe_env or {}))

        stack = bridge_runner.BridgeStack(pretrain=pretrain, forward_step=None,
                                          build_container=build, needs_cuda=False,
                                          capability=lambda: capability)
        env = DistEnv(rank=0, local_rank=0, world_size=s.world_size, master_addr="127.0.0.1",
                      master_port=1, source="torchrun")
        return bridge_runner.run_bridge_trial(s, env=env, stack=stack), seen
    return go


def test_the_environment_is_in_place_before_the_gpu_is_bound(run_until_pretrain):
    res, seen = run_until_pretrain(spec(tp=2))
    assert res.status == Status.FAILED and "pretrain reached" in res.error
    at_bind = seen["at_bind"]
    assert at_bind["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert at_bind["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert at_bind["NCCL_DEBUG"] == "INFO" and at_bind["NCCL_DEBUG_SUBSYS"] == "INIT"
    assert res.verification["prestart_env"]["exported"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert res.verification["prestart_env"]["capability"] == [9, 0]


def test_recipe_mode_exports_before_cuda_and_notes_the_recipes_difference(run_until_pretrain):
    recipe_env = {**RECIPE_ENV_VARS, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
    res, seen = run_until_pretrain(spec(bridge_recipe=RECIPE), recipe_env, BLACKWELL)
    assert seen["at_bind"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in seen["at_bind"]  # Blackwell: not needed
    assert ("recipe env_vars differ from what was exported before CUDA (the exported value "
            "stays): PYTORCH_CUDA_ALLOC_CONF: recipe expandable_segments:False, exported "
            "expandable_segments:True") in res.notes


# ---------------------------------------------------------------- placement

GROUPS = {"a2a": [[0, 1], [2, 3], [4, 5], [6, 7]], "p2p": [[0, 2, 4, 6], [1, 3, 5, 7]]}


def test_block_placement_passes_and_cyclic_fails_with_the_fix():
    block = ["n1"] * 4 + ["n2"] * 4
    assert placement.placement_problems(GROUPS, block) == []
    assert placement.rank_nodes(block) == [0, 0, 0, 0, 1, 1, 1, 1] and placement.is_block(block)
    cyclic = ["n1", "n2"] * 4
    assert not placement.is_block(cyclic)
    with pytest.raises(placement.PlacementError) as err:
        placement.check(GROUPS, cyclic)
    assert str(err.value) == (
        "rank placement: ranks must fill one node after another (srun --distribution=block), "
        "or the all-to-all crosses nodes: a2a group [0, 1] is planned on one node (4 tasks per "
        "node, block order) but ran on 2 hosts: n1, n2 (and 3 more group(s))")


def test_an_a2a_group_the_plan_itself_spreads_over_nodes_is_not_a_placement_problem():
    # 2 tasks per node: the plan's [0..3] a2a group crosses nodes by design
    groups = {"a2a": [[0, 1, 2, 3]]}
    assert placement.placement_problems(groups, ["n1", "n1", "n2", "n2"]) == []


def test_nccls_channel_lines_give_the_transports(tmp_path):
    text = "\n".join([
        "host:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
        "host:1:2 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
        "host:1:2 [0] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/IB/0/GDRDMA",
        "host:1:2 [0] NCCL INFO Connected all rings"])
    assert placement.transports(text) == ["NET/IB", "P2P/CUMEM"]
    log = tmp_path / "nccl.log"
    assert placement.read_transports(log) is None
    log.write_text(text)
    assert placement.read_transports(log) == ["NET/IB", "P2P/CUMEM"]
    assert placement.nccl_log_env(log, {"NCCL_DEBUG": "WARN"}) == {}  # the user's choice
