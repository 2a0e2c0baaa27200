"""Packed (THD) mock data for a Bridge trial: the trial's documents, laid out as Bridge's own
packer lays them, handed to Bridge's forward step with their cu_seqlens.

Why our own data. Megatron-Bridge v0.6.0 (51885cf1) packs only for fine-tuning: offline
packing (``dataset.enable_offline_packing`` with ``offline_packing_specs``, a
``data.packing.config.PackedSequenceSpecs``) reads packed files that ``GPTSFTDatasetConfig``
writes from a real data set; its mock pretraining data (``MockGPTDatasetConfig`` ->
Megatron-Core's ``MockGPTDataset``) has no packed form Bridge reads: Megatron-Core's
``GPTDatasetConfig.inter_document_masking`` (Megatron-LM cd4afffa, ``datasets/gpt_dataset.py``)
returns a legacy ``cu_seqlens`` padded with ``seq_length`` entries, which Bridge's
``gpt_step._trim_padded_cu_seqlens_for_cp`` cannot trim under CP (it wants negative
sentinels or ``cu_seqlens_argmin``), and its documents are uniform random lengths, not the
user's mix. So the smallest real route is Bridge's ``DatasetProvider`` protocol
(``data/base.py``: a ``DataloaderConfig`` with ``build_datasets(context)``, which
``data/utils.get_dataset_provider`` adapts): ``PackedDocsProvider`` (``provider_class``)
builds ``PackedDocsDataset`` below, and Bridge's loader (``data/loaders.py``) uses its
``collate_fn``. It depends on exactly these Bridge v0.6.0 behaviours:

- ``gpt_step.get_batch``: a batch with ``cu_seqlens_q`` takes the current packed path
  (``_CURRENT_PACKED_SEQ_*_KEYS``: ``cu_seqlens_q/_kv`` and their ``_padded`` forms to the
  GPU, ``max_seqlen_q/_kv`` to the host), is split over CP by Megatron-Core's THD partition
  (``_partition_packed_batch_for_cp``, on ``cu_seqlens_q_padded``; micro-batch size 1), and
  ``utils/packed_seq_utils.get_packed_seq_params`` builds a ``PackedSeqParams`` with
  ``qkv_format="thd"`` that the model's ``TEDotProductAttention`` passes to TE;
- ``ConfigContainer.validate`` (``training/config.py``): ``enable_offline_packing`` needs
  ``offline_packing_specs`` and micro-batch size 1; ``gpt_step._uses_packed_sequence_metadata``
  then gives middle pipeline stages the packed metadata too.

The layout is Bridge's packer's (``data/packing/gpt_sft.py`` ``collate_fn`` with
``pad_seq_to_mult > 1``): each document padded to a multiple of ``2*cp`` (the offsets
``cu_seqlens_q_padded``), its real tokens first (``cu_seqlens_q``, a tensor of its own:
Bridge always builds a separate padded tensor, which is what TE >= 2.18 sees); an unfilled
tail after the last document becomes one more padded entry whose real length is 0;
``cu_seqlens_kv`` is ``cu_seqlens_q`` (the same object, as Bridge's collate sets it);
``max_seqlen`` is the longest padded entry. Loss and positions: loss on real tokens only,
positions restart at every document. The tokens are Megatron-Core's mock pattern (the
lengths matter, not the tokens).

Standard library at import (``config`` imports ``packed_fields``); torch inside; Bridge
only in ``provider_class`` (its package imports TE: the class is defined in the job, on
first use, and the tests run everything else without Bridge).
"""
from __future__ import annotations

from typing import Any

from hcp_tune.packing import cu_seqlens

PROVIDER = "hcp_tune.job.bridge.packed_data:packed_provider"
# Bridge v0.6.0 data/packing/config.py: PackedSequenceSpecs(packed_sequence_size=,
# pad_seq_to_mult=) (the fields set here; the others keep their defaults)
PACKED_SPECS = "megatron.bridge.data.packing.config:PackedSequenceSpecs"
PACKED_KEYS = ("cu_seqlens_q", "cu_seqlens_q_padded", "max_seqlen_q")  # per sample


class PackedDataError(ValueError):
    """Packed documents that cannot become a Bridge trial's data."""


def offsets(docs: list[int], seq: int, cp: int) -> tuple[list[int], list[int]]:
    """(``cu_seqlens_q``, ``cu_seqlens_q_padded``) of one packed sequence of ``seq`` tokens:
    the cumulative real lengths (TE's logical offsets) and the cumulative padded ones (its
    physical offsets); the unfilled tail a last entry of real length 0 (Bridge's packer)."""
    real, pad = cu_seqlens(docs), cu_seqlens(docs, cp)
    if pad[-1] > seq:
        raise PackedDataError(f"packed documents {docs[:6]}...: padded to 2*cp={2 * cp} they "
                              f"take {pad[-1]} tokens > seq={seq}")
    if pad[-1] < seq:
        pad, real = pad + [seq], real + [real[-1]]
    return real, pad


def sample(docs: list[int], seq: int, cp: int, vocab: int) -> dict[str, Any]:
    """One packed sequence as the tensors Bridge's packed batch holds (no batch dimension)."""
    import torch

    real, pad = offsets(docs, seq, cp)
    tokens = torch.zeros(seq, dtype=torch.long)
    labels = torch.zeros(seq, dtype=torch.long)
    loss_mask = torch.zeros(seq, dtype=torch.float)
    position_ids = torch.zeros(seq, dtype=torch.long)
    for start, d in zip(pad[:-1], docs):
        text = (torch.arange(d + 1) + 1) % vocab  # MockGPTLowLevelDataset's pattern
        tokens[start:start + d] = text[:-1]
        labels[start:start + d] = text[1:]
        loss_mask[start:start + d] = 1.0
        position_ids[start:start + d] = torch.arange(d)
    lengths = [b - a for a, b in zip(pad, pad[1:])]
    return {"tokens": tokens, "labels": labels, "loss_mask": loss_mask,
            "position_ids": position_ids,
            "cu_seqlens_q": torch.tensor(real, dtype=torch.int32),
            "cu_seqlens_q_padded": torch.tensor(pad, dtype=torch.int32),
            "max_seqlen_q": torch.tensor(max(lengths), dtype=torch.int32)}


def collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """Samples stacked on a batch dimension; ragged offsets extended with zero-length
    entries (Bridge's packer); the kv offsets the same tensors as the q ones."""
    import torch

    out: dict[str, Any] = {}
    for key in batch[0]:
        if key.startswith("cu_seqlens"):
            width = max(len(b[key]) for b in batch)
            out[key] = torch.stack([torch.cat([b[key], b[key][-1:].repeat(width - len(b[key]))])
                                    for b in batch])
        else:
            out[key] = torch.stack([b[key] for b in batch])
    out["cu_seqlens_kv"] = out["cu_seqlens_q"]
    out["cu_seqlens_kv_padded"] = out["cu_seqlens_q_padded"]
    out["max_seqlen_kv"] = out["max_seqlen_q"]
    return out


class PackedDocsDataset:
    """``size`` samples cycling through the trial's packed sequences (a map-style dataset
    with Bridge's loader's ``collate_fn``)."""

    def __init__(self, packed_docs: list[list[int]], *, seq: int, cp: int, vocab: int,
                 size: int) -> None:
        if not packed_docs or not all(packed_docs):
            raise PackedDataError("packed mode with no documents: TrialSpec.packed_docs is "
                                  "empty (the sweep fills it from data.lengths)")
        for docs in packed_docs:
            offsets(docs, seq, cp)  # every sequence fits, or one line says which does not
        self.packed_docs, self.seq, self.cp, self.vocab = packed_docs, seq, cp, vocab
        self.size = max(1, int(size))
        self.collate_fn = collate

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, Any]:
        docs = self.packed_docs[int(i) % len(self.packed_docs)]
        return sample(docs, self.seq, self.cp, self.vocab)


def provider_kwargs(spec) -> dict[str, Any]:
    """The arguments of our provider of the trial's packed documents (``PROVIDER``), with
    Bridge's packing fields set as its offline packing would be (``enable_offline_packing``;
    ``offline_packing_specs``: ``PackedSequenceSpecs``' arguments, packed_sequence_size =
    seq, documents padded to 2*cp) and the mock data's loader settings; a
    ``PackedDataError`` (one line) for a trial Bridge cannot train packed."""
    from hcp_tune.job.bridge.parity import RECIPE_NUM_WORKERS

    if spec.mbs != 1:
        raise PackedDataError(
            f"runner=bridge with data.packing=thd and mbs={spec.mbs}: Bridge 0.6 trains packed "
            "(THD) sequences one per micro-batch (training/config.py, offline packing; "
            "gpt_step.py: 'Packed THD batches expect micro-batch size 1'); set mbs=1 (a "
            "micro-batch is then one packed sequence of seq tokens)")
    if not spec.packed_docs:
        raise PackedDataError("runner=bridge with data.packing=thd: the trial carries no "
                              "documents (TrialSpec.packed_docs); sweep with data.lengths=")
    for docs in spec.packed_docs:
        if not docs or min(docs) < 1 or cu_seqlens(docs, spec.cp)[-1] > spec.seq:
            raise PackedDataError(f"packed documents {docs[:6]}: padded to 2*cp they do not "
                                  f"fit seq={spec.seq}, or one is empty")
    return {"seq_length": spec.seq, "packed_docs": [list(map(int, d)) for d in spec.packed_docs],
            "cp": spec.cp, "vocab_size": spec.vocab, "random_seed": spec.seed,
            "enable_offline_packing": True,
            "offline_packing_specs": {"packed_sequence_size": spec.seq,
                                      "pad_seq_to_mult": 2 * spec.cp},
            "dataloader_type": "single", "num_workers": RECIPE_NUM_WORKERS,
            "data_sharding": True}


def provider_class() -> type:
    """``PackedDocsProvider``: Bridge v0.6.0's ``data/base.py`` ``DatasetProvider`` (a
    ``DataloaderConfig`` dataclass: ``dataloader_type``, ``num_workers``, ``data_sharding``,
    ``pin_memory``, ...; abstract ``build_datasets(context: DatasetBuildContext)``) whose
    training set is the trial's packed sequences; no validation or test set.
    ``enable_offline_packing`` and ``offline_packing_specs`` are the names
    ``training/config.py`` and ``training/gpt_step.py`` read with ``getattr``. Defined on
    first call (Bridge imports TE) and kept as this module's ``PackedDocsProvider``, so the
    class is found by name like any other (Bridge's config logging and YAML)."""
    cls = globals().get("PackedDocsProvider")
    if cls is not None:
        return cls
    from dataclasses import dataclass, field

    from megatron.bridge.data.base import DatasetProvider

    @dataclass(kw_only=True)
    class PackedDocsProvider(DatasetProvider):
        seq_length: int
        packed_docs: list = field(default_factory=list)  # per sequence: real lengths
        cp: int = 1  # documents are padded to a multiple of 2*cp
        vocab_size: int = 128
        random_seed: int = 1234  # the loader's sampler seed (data/loaders.py reads it)
        enable_offline_packing: bool = True
        offline_packing_specs: Any = None  # a PackedSequenceSpecs

        def build_datasets(self, context):
            train = PackedDocsDataset(self.packed_docs, seq=self.seq_length, cp=self.cp,
                                      vocab=self.vocab_size, size=context.train_samples)
            return train, None, None

    PackedDocsProvider.__module__ = __name__
    PackedDocsProvider.__qualname__ = "PackedDocsProvider"
    globals()["PackedDocsProvider"] = PackedDocsProvider
    return PackedDocsProvider


def packed_provider(**kwargs: Any) -> Any:
    """The provider of a trial's packed documents (``PROVIDER``: what ``config`` builds)."""
    return provider_class()(**kwargs)
