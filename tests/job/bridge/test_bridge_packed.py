"""The Bridge runner's packed mode without Bridge (issue 37, part 4): the packed mock data as
Bridge's packer lays it out (hcp_tune/job/bridge/packed_data.py), the config that hands it to
Bridge (the ``dataset`` provider, Bridge's packing fields), the forward-time probe and the
THD + CP check (thd.py). The runner end to end with it: test_bridge_runner_double.py."""
import ast
import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from megatron.core.packed_seq_params import PackedSeqParams

from hcp_tune.job.bridge import config as bc
from hcp_tune.job.bridge import packed_data as pd
from hcp_tune.job.bridge.thd import ThdProbe, check_thd
from hcp_tune.job.bridge.verify import RankEvidence
from hcp_tune.spec import TrialSpec

REPO = Path(__file__).resolve().parents[3]
FIELDS = json.loads((REPO / "tests" / "data" / "bridge_fields.json").read_text())
DOCS = [[13, 20, 9]]  # at cp=4 padded to 16 + 24 + 16 = 56 of seq=64: an 8-token tail


def spec(**kw):
    base = dict(trial_id="t", a2a=2, p2p=2, seq=64, heads=8, kv_heads=8, head_dim=8, hidden=64,
                ffn_hidden=256, layers=2, vocab=1024, runner="bridge", warmup_steps=1,
                measure_steps=2, packing="thd", packed_docs=DOCS, mix="doc3#abcdef")
    base.update(kw)
    return TrialSpec(**base)


# ---------------------------------------------------------------- the data


def test_offsets_are_bridges_packer_the_tail_a_last_entry_of_real_length_0():
    real, pad = pd.offsets([13, 20, 9], 64, 4)
    assert pad == [0, 16, 40, 56, 64]  # each document padded to 2*cp = 8, then the tail
    assert real == [0, 13, 33, 42, 42]  # cumulative real lengths (TE's logical offsets)
    assert pd.offsets([16, 48], 64, 4) == ([0, 16, 64], [0, 16, 64])  # full: no tail entry


def test_a_sample_trains_on_real_tokens_with_positions_restarting_per_document():
    s = pd.sample([13, 20, 9], 64, 4, vocab=16)
    assert s["loss_mask"].sum() == 42 and s["loss_mask"][13:16].sum() == 0  # padding
    assert s["position_ids"][16:36].tolist() == list(range(20))
    assert s["position_ids"][56:].tolist() == [0] * 8 and int(s["tokens"].max()) < 16
    assert s["tokens"][1:13].tolist() == s["labels"][:12].tolist()  # next token in a document
    assert int(s["max_seqlen_q"]) == 24  # the longest padded entry
    assert s["cu_seqlens_q"].dtype == torch.int32


def test_collate_gives_kv_the_q_tensors_and_a_separate_padded_tensor():
    ds = pd.PackedDocsDataset([[13, 20, 9], [30]], seq=64, cp=4, vocab=16, size=5)
    assert len(ds) == 5
    batch = ds.collate_fn([ds[0], ds[1]])
    assert batch["cu_seqlens_kv"] is batch["cu_seqlens_q"]
    assert batch["cu_seqlens_kv_padded"] is batch["cu_seqlens_q_padded"]
    assert batch["cu_seqlens_q_padded"] is not batch["cu_seqlens_q"]  # TE #3487's case
    assert batch["cu_seqlens_q"].tolist()[1] == [0, 30, 30, 30, 30]  # ragged: zero-length
    assert batch["tokens"].shape == (2, 64) and batch["max_seqlen_q"].tolist() == [24, 32]


@pytest.mark.parametrize("docs,message", [
    ([], "packed mode with no documents"),
    ([[60, 9]], "padded to 2*cp=8 they take 80 tokens > seq=64"),
])
def test_documents_that_cannot_be_packed_are_refused_in_one_line(docs, message):
    with pytest.raises(pd.PackedDataError, match=message.replace("*", r"\*")):
        pd.PackedDocsDataset(docs, seq=64, cp=4, vocab=16, size=1)


# ---------------------------------------------------------------- the config


def _provider_fields() -> set:
    """The fields ``packed_data.PackedDocsProvider`` declares (read from the source: the
    class subclasses Bridge's, which this machine cannot import)."""
    tree = ast.parse((REPO / "hcp_tune/job/bridge/packed_data.py").read_text())
    cls = next(n for n in ast.walk(tree)
               if isinstance(n, ast.ClassDef) and n.name == "PackedDocsProvider")
    assert [b.id for b in cls.bases] == ["DatasetProvider"]
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}


@pytest.mark.parametrize("recipe", [None, "llama3_8b_pretrain_config"])
def test_a_packed_trial_hands_bridge_its_documents_with_bridges_packing_fields(recipe):
    fields = bc.bridge_fields(spec(bridge_recipe=recipe))
    assert not any(k.startswith("dataset.") for k in fields)  # no mock data beside it
    data = fields["dataset"]
    assert data.cls == pd.PROVIDER and data.kwargs["packed_docs"] == DOCS
    mine, loader = _provider_fields(), set(FIELDS["sections"]["dataset"])
    assert set(data.kwargs) <= mine | loader, set(data.kwargs) - mine - loader
    assert {"enable_offline_packing", "offline_packing_specs"} <= mine
    specs = data.kwargs["offline_packing_specs"]
    assert specs.cls == pd.PACKED_SPECS and specs.kwargs == {"packed_sequence_size": 64,
                                                             "pad_seq_to_mult": 8}
    assert fields["model.seq_length"] == data.kwargs["seq_length"] == 64
    assert fields["train.micro_batch_size"] == 1
    for path in bc.container_paths(fields):  # every other path is still Bridge's
        head, _, rest = path.partition(".")
        assert head in FIELDS["container"] and (not rest or rest in FIELDS["sections"][head])


def test_the_unpacked_trial_keeps_the_mock_data():
    fields = bc.bridge_fields(spec(packing="off", packed_docs=[]))
    assert "dataset" not in fields and fields["dataset.create_attention_mask"] is False


@pytest.mark.parametrize("kw,message", [
    ({"mbs": 2}, "data.packing=thd and mbs=2: Bridge 0.6 trains packed (THD) sequences one "
                 "per micro-batch"),
    ({"packed_docs": []}, "the trial carries no documents"),
    ({"packed_docs": [[60, 9]]}, "padded to 2*cp they do not fit seq=64"),
])
def test_a_packed_trial_bridge_cannot_run_is_one_line(kw, message):
    with pytest.raises(bc.BridgeConfigError) as e:
        bc.bridge_fields(spec(**kw))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_build_container_builds_the_provider_in_place_of_the_mock_section(monkeypatch):
    monkeypatch.setattr(bc, "resolve", lambda path: lambda **kw: SimpleNamespace(_cls=path, **kw))
    cfg = bc.build_container(bc.bridge_fields(spec()))
    assert cfg.dataset._cls == pd.PROVIDER and cfg.dataset.cp == 4
    assert cfg.dataset.offline_packing_specs._cls == pd.PACKED_SPECS
    assert cfg.model.context_parallel_size == 4


# ---------------------------------------------------------------- the probe and the check


class AttentionStandIn(torch.nn.Module):
    """Holds the CP settings TE's attention keeps; records what its forward was handed."""

    def __init__(self, group):
        super().__init__()
        self.cp_comm_type, self.cp_group, self.cp_global_ranks = "p2p", group, [0, 1]
        self.got = None

    def forward(self, x, packed_seq_params=None):
        self.got = packed_seq_params
        return x


@dataclass
class ParamsWithPadFlag:
    """Megatron-Core's PackedSeqParams from 0.17 on carries pad_between_seqs (this venv's
    0.16.1 does not): its fields as the probe reads them."""

    qkv_format: str = "thd"
    cu_seqlens_q: torch.Tensor = None
    cu_seqlens_q_padded: torch.Tensor = None
    cp_group: object = None
    local_cp_size: int = None
    pad_between_seqs: bool = None


def _probe_run(params, group="G"):
    net = torch.nn.Sequential(AttentionStandIn(group), AttentionStandIn(group))
    probe = ThdProbe(is_attention=lambda m: isinstance(m, AttentionStandIn),
                     ranks_of=lambda g: [0, 1])
    assert probe.attach([net]) == 2
    for m in net:
        m(torch.zeros(1), packed_seq_params=params)
    return net, probe.evidence(0)


def test_the_probe_records_the_first_forward_and_fills_pad_between_seqs_only_when_unset():
    cu, cu_pad = torch.tensor([0, 13, 33]), torch.tensor([0, 16, 40])
    net, ev = _probe_run(ParamsWithPadFlag(cu_seqlens_q=cu, cu_seqlens_q_padded=cu_pad))
    m = ev["modules"][0]
    assert (m["packed"], m["qkv_format"], m["documents"], m["cp_groups"]) == (
        True, "thd", 2, [[0, 1]])
    assert m["pad_between_seqs"] is True and m["pad_between_seqs_set_here"]
    assert net[0].got.pad_between_seqs is True  # what TE is handed
    _, ev = _probe_run(ParamsWithPadFlag(cu_seqlens_q=cu, cu_seqlens_q_padded=cu,
                                         pad_between_seqs=False))
    assert ev["modules"][0]["pad_between_seqs"] is False  # a value given is kept
    assert ev["modules"][0]["padded_is_unpadded"] is True
    real = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_q_padded=cu_pad)
    net, ev = _probe_run(real)
    assert net[0].got is real and not ev["modules"][0]["pad_between_seqs_set_here"]


def _evidence(**module):
    m = {"name": "chunk0.0", "packed": True, "qkv_format": "thd", "documents": 3,
         "padded_is_unpadded": False, "pad_between_seqs": True,
         "pad_between_seqs_set_here": True, "cp_off": False, "cp_comm_type": "p2p",
         "cp_groups": [[0, 1]], "cp_global_ranks": [0, 1], **module}
    return [{"rank": r, "modules": [dict(m)]} for r in (0, 1)]


START = [RankEvidence(rank=r, cp_state=[0, 1]) for r in (0, 1)]
PLAN = {"cp": [[0, 1]]}


@pytest.mark.parametrize("module,problem", [
    ({}, None),
    ({"packed": False, "qkv_format": None}, "ran without packed_seq_params"),
    ({"qkv_format": "sbhd"}, "got qkv_format='sbhd', expected 'thd'"),
    ({"cp_off": True, "cp_groups": None}, "turned CP off in forward"),
    ({"cp_groups": [[0]]}, "(in forward)'s CP group [[0]] is not one group of cp = 2 ranks"),
])
def test_check_thd_names_what_the_first_forwards_lacked(module, problem):
    problems = check_thd(_evidence(**module), START, ("p2p", 1, 2), PLAN)
    assert (problems == []) if problem is None else (problem in problems[0]), problems


def test_check_thd_without_cp_checks_the_layout_alone():
    assert check_thd([{"rank": 0, "modules": []}], [], None) == [
        "rank 0: no attention forward was recorded in the first step: THD cannot be proven"]
    assert check_thd(_evidence(cp_groups=[[0]]), [], None) == []  # no CP planned: no groups


# ---------------------------------------------------------------- FLOPs


def test_a_packed_trial_counts_its_attention_over_its_documents():
    from hcp_tune.job.bridge import runner
    from hcp_tune.job.bridge.measure import StepRecord, StepRecorder

    model = SimpleNamespace(seq_length=64, num_layers=2, hidden_size=64, ffn_hidden_size=256,
                            num_attention_heads=8, num_query_groups=None, kv_channels=8,
                            vocab_size=1000, tensor_model_parallel_size=1, gated_linear_unit=True,
                            make_vocab_size_divisible_by=128)
    cfg = SimpleNamespace(model=model, train=SimpleNamespace(global_batch_size=3))
    fixed = runner.ported_flops(cfg, spec(packing="off", packed_docs=[]))
    packed = runner.ported_flops(cfg, spec())
    q = 8 * 8
    assert fixed - packed == 3 * 6 * 2 * q * (64 * 64 - (13 * 13 + 20 * 20 + 9 * 9))
    # Bridge v0.6.0 counts S^2 attention under CP for packed batches: the port is used
    rec = StepRecorder(warmup_steps=0)
    rec.steps = [StepRecord(step=0, time_s=1.0, lm_loss=1.0)]
    rec.flops_start, rec.flops_end = 0.0, 2 * fixed
    assert rec.result(world_size=2, flops_per_step_ported=packed,
                      prefer_ported=True).flops_per_step == packed
    assert rec.result(world_size=2, flops_per_step_ported=packed).flops_per_step == 2 * fixed
