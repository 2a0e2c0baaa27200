"""A test double of Megatron-Bridge's ``pretrain`` protocol, for running
``hcp_tune.job.bridge.runner._run`` end to end on CPU (gloo). Not Bridge: a stand-in.

Everything it does around the callbacks comes from tests/data/bridge_protocol.json, the
extract of the pinned Bridge source (scripts/bridge_protocol.py, v0.6.0 51885cf1): the
contexts carry exactly ``CallbackContext``'s fields (the ones each ``fire`` passes, the rest
None), the events fire in the extract's order before, inside and after the loop, the loop
runs while its extracted condition holds (read again each pass, so lowering
``cfg.train.train_iters`` ends it), and the step and FLOP counters move where the extract
says (after ``on_train_step_end``). ``forward_step_double`` has the extracted parameters.

What it runs: ``runtime_config_update_double`` first, as Bridge's ``pretrain`` does (the
container's ``env_vars`` applied with ``setdefault``, the data-parallel size from the world,
then Bridge's validation rules that a trial can meet, restated in ``validate_double`` with
where each lives), then Megatron-Core's real ``initialize_model_parallel`` on gloo with the
config's tp, pp, cp and hierarchical sizes, and per pipeline stage a few tiny blocks whose
``AttentionDouble`` modules carry ``cp_comm_type``, ``cp_group`` and ``cp_global_ranks`` as
Megatron-Core's ``TEDotProductAttention`` hands them to TE (``[a2a, p2p]`` for a2a+p2p from
``get_hierarchical_context_parallel_groups(check_initialized=False)``, so None when the
sizes never reached it; the flat CP group otherwise). A step runs ``global_batch /
(micro_batch * dp)`` micro-batches (Megatron-Core's micro-batch calculator), and the mock
data builds Megatron-Core's S x S mask per sample unless ``dataset.create_attention_mask``
is False (its default is True). ``plant_wrong_group`` gives one module on rank 0 its levels
swapped, which the runner's CP proof must catch. ``te_log_line`` makes the first attention
forward log a line on TE's logger, as TE's backend selection does with NVTE_DEBUG.
``record`` names a JSON file the double writes: micro-batches per step, mask bytes built,
whether Python's automatic GC was on inside each step (Bridge's loop calls ``gc.disable()``
before the first step when ``train.manual_gc``: training/train.py), and the
``CUDA_DEVICE_MAX_CONNECTIONS`` ``pretrain`` found. ``cyclic_hosts`` makes each rank report
host ``node<rank % 2>`` (a cyclic SLURM distribution over two nodes), which the runner's
placement check must refuse. ``nccl_log_line`` is written to ``NCCL_DEBUG_FILE`` when the
runner asked for one, as NCCL's INIT log would carry it (gloo writes none). A packed trial's
dataset (``packed_data.PackedDocsDataset``, from the ``dataset`` Construct's arguments) feeds
the steps, each batch split over CP and its ``PackedSeqParams`` handed to every attention
module (packed_double.py); ``packed="drop"`` or ``"cp_off"`` loses the cu_seqlens or turns CP
off in forward, which the runner's THD proof must catch.

Run as a script, it forks the ranks of tests/job/bridge/test_bridge_runner_double.py.
"""
from __future__ import annotations

import gc
import json
import logging
import math
import os
import socket
import sys
from datetime import timedelta
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import torch
import torch.distributed as dist
from packed_double import ModelDouble, packed_params_double, partition_double

PROTOCOL = json.loads((Path(__file__).parents[2] / "data" / "bridge_protocol.json").read_text())


def _section(fields: dict, name: str) -> SimpleNamespace:
    return SimpleNamespace(**{k.split(".", 1)[1]: v for k, v in fields.items()
                              if k.startswith(name + ".") and k.count(".") == 1})


def _built(value):
    """A ``config.Construct`` as the namespace of its arguments (``_target_``: its class),
    nested ones too; Bridge's own classes cannot be imported here."""
    from hcp_tune.job.bridge.config import Construct

    if isinstance(value, Construct):
        return SimpleNamespace(_target_=value.cls,
                               **{k: _built(v) for k, v in value.kwargs.items()})
    return value


def build_container_double(fields: dict) -> SimpleNamespace:
    """The trial's field mapping as nested namespaces (paths checked elsewhere against
    Bridge's real field names: tests/data/bridge_fields.json); ``env_vars`` as it is; a
    whole section given as a ``Construct`` (the packed dataset) as its arguments."""
    heads = {k.split(".")[0] for k in fields if "." in k}
    whole = {k: _built(v) for k, v in fields.items() if "." not in k
             and k not in ("recipe", "env_vars", "mixed_precision")}
    return SimpleNamespace(**{h: _section(fields, h) for h in heads}, **whole,
                           env_vars=dict(fields.get("env_vars") or {}))


class BridgeValidationError(AssertionError):
    """What Bridge's validation raises (an assert) for a config it refuses."""


def validate_double(config) -> None:
    """Bridge v0.6.0's checks a trial's config can meet, restated (the rules, not the code):
    ``ConfigContainer._validate_cp_comm_type`` (training/config.py ~l.1521): a per-layer
    ``cp_comm_type`` list has one entry per layer, ``a2a+p2p`` needs
    ``hierarchical_context_parallel_sizes``, whose product is the CP size;
    ``ConfigContainer.validate`` (~l.1500): ``model.seq_length == dataset.seq_length``;
    Megatron-Core's micro-batch calculator: the global batch divides by micro batch * dp."""
    m, t = config.model, config.train
    cp, comm = m.context_parallel_size, getattr(m, "cp_comm_type", None)
    sizes = getattr(m, "hierarchical_context_parallel_sizes", None)
    kinds = comm if isinstance(comm, list) else [comm or "p2p"]
    if isinstance(comm, list) and cp > 1 and len(comm) != m.num_layers:
        raise BridgeValidationError(f"cp_comm_type has {len(comm)} entries, {m.num_layers} layers")
    if any("a2a+p2p" in k for k in kinds) and sizes is None:
        raise BridgeValidationError("hierarchical_context_parallel_sizes must be set when "
                                    "cp_comm_type contains 'a2a+p2p'")
    if sizes is not None and math.prod(sizes) != cp:
        raise BridgeValidationError(f"product of hierarchical_context_parallel_sizes {sizes} "
                                    f"must equal context_parallel_size {cp}")
    if m.seq_length != config.dataset.seq_length:
        raise BridgeValidationError(f"model seq_length {m.seq_length} != dataset seq_length "
                                    f"{config.dataset.seq_length}")
    if getattr(config.dataset, "enable_offline_packing", False) and t.micro_batch_size > 1:
        raise BridgeValidationError("Micro batch size should be 1 when training with packed "
                                    "sequence")  # ConfigContainer.validate, ~l.1456
    dp = config.data_parallel_size
    if t.global_batch_size % (t.micro_batch_size * dp):
        raise BridgeValidationError(f"global batch {t.global_batch_size} is not divisible by "
                                    f"micro batch {t.micro_batch_size} * dp {dp}")


def runtime_config_update_double(config, world: int) -> None:
    """``runtime_config_update`` as the double runs it: ``env_vars`` with ``setdefault``
    (training/config.py ``apply_environment_variables``), the data-parallel size, the checks."""
    for name, value in config.env_vars.items():
        os.environ.setdefault(name, str(value))
    m = config.model
    config.data_parallel_size = world // (m.tensor_model_parallel_size
                                          * m.pipeline_model_parallel_size
                                          * m.context_parallel_size)
    validate_double(config)


class AttentionDouble(torch.nn.Module):
    """A linear mix standing in for TE's attention, holding the CP settings TE keeps."""

    def __init__(self, hidden: int, *, cp_comm_type: str, cp_group: Any, cp_global_ranks,
                 te_log_line: Optional[str]) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.cp_comm_type, self.cp_group, self.cp_global_ranks = (
            cp_comm_type, cp_group, cp_global_ranks)
        self.te_log_line = te_log_line

    def forward(self, x, packed_seq_params=None):
        if self.te_log_line:  # once, as TE logs its choice once per new set of shapes
            logger = logging.getLogger("DotProductAttention")
            logger.setLevel(logging.DEBUG)  # what TE sets with NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2
            logger.debug(self.te_log_line)
            self.te_log_line = None
        return x + torch.tanh(self.proj(x))


def is_attention_double(module: Any) -> bool:
    return isinstance(module, AttentionDouble)


def _cp_settings(model_cfg) -> dict:
    from megatron.core import parallel_state as ps

    comm = getattr(model_cfg, "cp_comm_type", None) or "p2p"
    flat = ps.get_context_parallel_group()
    if comm == "a2a+p2p":  # as Megatron-Core's TEDotProductAttention asks for them
        hier = ps.get_hierarchical_context_parallel_groups(check_initialized=False)
        group: Any = list(hier) if hier is not None else None
    else:
        group = flat
    return dict(cp_comm_type=comm, cp_group=group,
                cp_global_ranks=ps.get_context_parallel_global_ranks())


def _context(**given) -> SimpleNamespace:
    """A context with exactly CallbackContext's fields (those not given: None)."""
    unknown = set(given) - set(PROTOCOL["context_fields"])
    assert not unknown, f"the double passes fields CallbackContext lacks: {unknown}"
    return SimpleNamespace(**{f: given.get(f) for f in PROTOCOL["context_fields"]})


def forward_step_double(state, data_iterator, model, return_schedule_plan: bool = False):
    """Bridge's forward_step protocol: (output, loss function of the output); a packed
    batch is split over CP and its ``PackedSeqParams`` handed to the model, as
    ``gpt_step.forward_step`` does."""
    batch = next(data_iterator)
    if isinstance(batch, dict):
        batch = partition_double(batch)
        out = model(batch["tokens"],
                    packed_seq_params=packed_params_double(batch, model.packed))
    else:
        out = model(batch)

    def loss_func(output):
        loss = output.float().pow(2).mean()
        return loss, {"lm loss": loss.detach()}
    return out, partial(loss_func)


class PretrainDouble:
    """``pretrain(config, forward_step_func, callbacks=None)`` on gloo, per the extract."""

    def __init__(self, *, plant_wrong_group: bool = False,
                 te_log_line: Optional[str] = None, hidden: int = 16,
                 record: Optional[str] = None, cyclic_hosts: bool = False,
                 nccl_log_line: Optional[str] = None, packed: str = "thd") -> None:
        self.plant_wrong_group, self.te_log_line, self.hidden = (
            plant_wrong_group, te_log_line, hidden)
        self.packed = packed
        self.record, self.cyclic_hosts = record, cyclic_hosts
        self.nccl_log_line = nccl_log_line
        self.seen: dict = {"micro_batches": [], "mask_bytes": 0, "gc_enabled_in_steps": []}

    def __call__(self, config, forward_step_func, callbacks=None) -> None:
        from megatron.core import parallel_state as ps

        self.seen["max_connections"] = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
        if self.nccl_log_line and os.environ.get("NCCL_DEBUG_FILE"):
            with open(os.environ["NCCL_DEBUG_FILE"], "a") as f:
                f.write(self.nccl_log_line + "\n")
        real_hostname = socket.gethostname
        if self.cyclic_hosts:
            socket.gethostname = lambda: f"node{int(os.environ['RANK']) % 2}"
        try:
            self._run(config, forward_step_func, callbacks, ps)
        finally:
            socket.gethostname = real_hostname
            if self.record:
                Path(self.record).write_text(json.dumps(self.seen))

    def _run(self, config, forward_step_func, callbacks, ps) -> None:
        runtime_config_update_double(config, int(os.environ["WORLD_SIZE"]))
        created = not dist.is_initialized()
        if created:  # Bridge's initialize: torchrun's variables, the configured timeout
            dist.init_process_group(
                "gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                timeout=timedelta(minutes=config.dist.distributed_timeout_minutes))
        m = config.model
        ps.initialize_model_parallel(
            tensor_model_parallel_size=m.tensor_model_parallel_size,
            pipeline_model_parallel_size=m.pipeline_model_parallel_size,
            context_parallel_size=m.context_parallel_size,
            hierarchical_context_parallel_sizes=m.hierarchical_context_parallel_sizes,
            create_gloo_process_groups=False)
        gc_was = gc.isenabled()
        try:
            if getattr(config.train, "manual_gc", False):  # Bridge's train loop, before step 1
                gc.disable()
            self._train(config, forward_step_func, callbacks or [])
        finally:
            if gc_was:  # the double runs several trials per process
                gc.enable()  # the double runs several trials per process; Bridge runs one
            ps.destroy_model_parallel()
            ps._HIERARCHICAL_CONTEXT_PARALLEL_GROUPS = None  # not reset by destroy (groups.py)
            if created:
                dist.destroy_process_group()

    def _model(self, config) -> list:
        m = config.model
        layers = m.num_layers // m.pipeline_model_parallel_size  # this stage's share
        cp = _cp_settings(m) if m.context_parallel_size > 1 else dict(
            cp_comm_type=None, cp_group=None, cp_global_ranks=None)
        blocks = []
        for i in range(layers):
            settings = dict(cp)
            if self.plant_wrong_group and i == 0 and dist.get_rank() == 0 and isinstance(
                    settings["cp_group"], list):
                settings["cp_group"] = settings["cp_group"][::-1]  # levels swapped
            blocks.append(AttentionDouble(self.hidden, te_log_line=self.te_log_line if i == 0
                                          else None, **settings))
        vocab = getattr(config.dataset, "vocab_size", None) or 8
        return [ModelDouble(blocks, self.hidden, vocab, self.packed)]

    def _train(self, config, forward_step_func, callbacks: list) -> None:
        model = self._model(config)
        optimizer = torch.optim.SGD(model[0].parameters(), lr=1e-3)
        state = SimpleNamespace(cfg=config, train_state=SimpleNamespace(
            step=0, floating_point_operations_so_far=0))
        tc = config.train
        micro = tc.global_batch_size // (tc.micro_batch_size * config.data_parallel_size)
        g = torch.Generator().manual_seed(config.rng.seed)
        seq = config.dataset.seq_length
        # Megatron-Core's GPTDatasetConfig.create_attention_mask defaults to True
        mask = getattr(config.dataset, "create_attention_mask", True)

        docs = getattr(config.dataset, "packed_docs", None)
        if docs:  # the trial's packed documents, as Bridge's loader collates them
            from hcp_tune.job.bridge.packed_data import PackedDocsDataset

            ds = PackedDocsDataset(docs, seq=seq, cp=config.dataset.cp,
                                   vocab=config.dataset.vocab_size, size=tc.micro_batch_size)
            self.seen["packed_batches"] = 0

        def data():
            while docs:
                self.seen["packed_batches"] += 1
                yield ds.collate_fn([ds[i] for i in range(tc.micro_batch_size)])
            while True:
                if mask:  # per sample, as the mock dataset builds it on the host
                    for _ in range(tc.micro_batch_size):
                        built = torch.tril(torch.ones((seq, seq))) < 0.5
                        self.seen["mask_bytes"] += built.numel() * built.element_size()
                yield torch.randn(tc.micro_batch_size, 8, self.hidden, generator=g)
        it = data()
        flops = 6.0 * sum(p.numel() for p in model[0].parameters()) * tc.global_batch_size * 8
        names = {"global_state": state, "train_config": tc}  # train_config = config.train

        def fire(event: str, fields: list[str], **extra) -> None:
            base = dict(state=state, model=model, user_state={}, optimizer=optimizer,
                        scheduler=None, **extra)
            ctx = _context(**{k: v for k, v in base.items() if k in fields})
            for cb in callbacks:
                fn = getattr(cb, event, None)
                if fn is not None:
                    fn(ctx)

        out: dict = {}

        def train_step() -> None:
            optimizer.zero_grad()
            self.seen["micro_batches"].append(micro)
            self.seen["gc_enabled_in_steps"].append(gc.isenabled())
            for _ in range(micro):
                output, loss_func = forward_step_func(state, it, model[0])  # one chunk
                loss, report = loss_func(output)
                loss.backward()
            optimizer.step()
            out.update(loss_dict=report, grad_norm=0.0, skipped_iter=False)

        before = [e for e in PROTOCOL["train"] if e["where"] == "before"]
        loop = [e for e in PROTOCOL["train"] if e["where"] == "loop"]
        after = [e for e in PROTOCOL["train"] if e["where"] == "after"]
        for e in before:
            fire(e["fire"], e["context"])
        while eval(PROTOCOL["loop_condition"], {}, names):  # the extracted condition
            for e in loop:
                if "fire" in e:
                    fire(e["fire"], e["context"], **out)
                elif e.get("call") == "train_step":
                    train_step()
                elif e.get("increment") == "step":
                    state.train_state.step += 1
                elif e.get("increment") == "floating_point_operations_so_far":
                    state.train_state.floating_point_operations_so_far += flops
        for e in after:
            if "fire" in e:  # sys.exit only on Bridge's own exit conditions: none here
                fire(e["fire"], e["context"])


def double_stack(capability=(9, 0), **kw):
    """The double as the runner's stack; ``capability``: the GPU generation the runner is
    told (default Hopper, 9.0: before Blackwell)."""
    from hcp_tune.job.bridge.runner import BridgeStack

    cap = tuple(capability) if capability else None
    return BridgeStack(pretrain=PretrainDouble(**kw), forward_step=forward_step_double,
                       build_container=build_container_double, needs_cuda=False,
                       is_attention=is_attention_double, capability=lambda: cap)


def main(scenarios_file: str, out_dir: str) -> None:
    """One rank: every scenario of the file in turn, each with its own port; rank r writes
    ``<out_dir>/<name>.rank<r>.json``."""
    from hcp_tune.job.bridge.runner import run_bridge_trial
    from hcp_tune.job.dist import DistEnv
    from hcp_tune.spec import spec_from_json, to_json

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    base = int(os.environ["MASTER_PORT"])
    for i, sc in enumerate(json.loads(Path(scenarios_file).read_text())):
        spec = spec_from_json(json.dumps(sc["spec"]))
        env = DistEnv(rank=rank, local_rank=rank, world_size=world, master_addr="127.0.0.1",
                      master_port=base + i, source="torchrun")
        record = Path(out_dir, f"{sc['name']}.double.rank{rank}.json")
        kw = {**sc.get("double", {}), "record": str(record)}
        res = run_bridge_trial(spec, env=env, stack=double_stack(**kw))
        Path(out_dir, f"{sc['name']}.rank{rank}.json").write_text(to_json(res))


def fork_ranks(world: int, scenarios_file: str, out_dir: str) -> int:
    """Every rank of ``world`` forked from this process once the slow imports are done
    (torch and Megatron-Core take about 4 s of CPU a process: 8 ranks on 2 cores spent most
    of their time importing). Nothing has run a torch op or made a thread yet, so the fork
    is clean; each child runs ``main`` as rank r and exits with its status."""
    import traceback

    from megatron.core import parallel_state  # noqa: F401 (the import is the point)

    from hcp_tune.job.bridge import runner  # noqa: F401

    pids = []
    for r in range(world):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.environ.update(RANK=str(r), LOCAL_RANK=str(r))
                main(scenarios_file, out_dir)
                code = 0
            except BaseException:  # a rank's failure is its exit status, with its trace
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)
    statuses = [os.waitpid(pid, 0)[1] for pid in pids]
    return 0 if all(s == 0 for s in statuses) else 1


if __name__ == "__main__":  # pretrain_double.py WORLD SCENARIOS.json OUT_DIR
    sys.exit(fork_ranks(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
