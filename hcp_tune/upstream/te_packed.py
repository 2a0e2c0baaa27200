"""The HCP rules for packed sequences (THD: documents packed into one sequence, attention per
document through ``cu_seqlens``) under context parallelism, as Transformer Engine runs them and
as Megatron-Bridge 0.6 feeds them. Each check returns (what was found, the fix) or None;
``rules`` puts them in the table. Pure functions over ``Facts``: no torch, no files.

How packing reaches TE (read at Megatron-Bridge r0.6.0, Megatron-LM core_v0.19.0, TE v2.17.1,
v2.18 and release_v2.19):

- Bridge packs through its dataset config: offline packing
  (``dataset.enable_offline_packing`` with ``dataset.offline_packing_specs``, a
  ``PackedSequenceSpecs``: ``packed_sequence_size``, ``pad_seq_to_mult``, ``pad_cu_seqlens``;
  ``src/megatron/bridge/data/packing/config.py``, ``data/builders/gpt_sft.py``) or in-batch
  packing (``dataset.enable_in_batch_packing``, ``data/packing/in_batch.py``). Bridge <= 0.5
  called the specs ``dataset.packed_sequence_specs``.
- Under CP each document is padded to a multiple of 2*cp: ``scripts/training/recipe_runner.py``
  ``sync_offline_packing_alignment`` raises ``pad_seq_to_mult`` to lcm(it, 2*cp), and
  ``training/config.py`` ``ConfigContainer.validate`` sets ``in_batch_packing_pad_to_multiple_of``
  the same way. With a multiple > 1 the packer builds ``cu_seqlens_q_padded`` as a tensor of its
  own (``data/packing/gpt_sft.py`` collate, ``in_batch.py``).
- ``training/utils/packed_seq_utils.py`` ``get_packed_seq_params`` builds Megatron-Core's
  ``PackedSeqParams(qkv_format="thd", cu_seqlens_q, cu_seqlens_q_padded, ...)`` and never sets
  ``pad_between_seqs`` (None), so TE detects it; Megatron-Core's ``TEDotProductAttention``
  (``megatron/core/extensions/transformer_engine.py``) forwards the fields to TE's
  ``DotProductAttention.forward`` (``pad_between_seqs`` from TE 2.2).
- TE's detection (``dot_product_attention/dot_product_attention.py``): up to 2.17.1 by value,
  ``cu_seqlens_padded[:-1] != cu_seqlens[:-1]``, blind to tail padding (TE #3331); from 2.18
  (TE #2898) by object identity, ``cu_seqlens_q_padded is cu_seqlens_q`` (TE #3487).
"""
from __future__ import annotations

from hcp_tune.upstream.facts import Facts, drop_sizes
from hcp_tune.upstream.te import TE_EVEN_HEADS, vtext

TE_THD_HCP = (2, 19)  # TE #3290 (8ff60f8, release_v2.19): THD with a2a+p2p; asserted up to 2.18
TE_PAD_BY_IDENTITY = (2, 18)  # TE #2898 (4cd705b, v2.18): pad_between_seqs detected by identity
TE_FA3_PADDED = (2, 17)  # TE #2596 (80ea313, v2.17): FlashAttention 3 runs padded THD under CP
SHIPS = ("the NeMo 26.08 and 26.08.01 containers, with Megatron-Bridge 0.6.x, ship TE 2.18 "
         "(Bridge 0.6.0's own pyproject pins 2.17.1)")
PACKING_KEYS = ("dataset.enable_offline_packing", "dataset.offline_packing_specs",
                "dataset.enable_in_batch_packing")
PAD_KEY = "pad_between_seqs"  # validate's own key: what the user's forward step passes to TE
FORWARD_STEP = ("PackedSeqParams(pad_between_seqs=True) in the forward step (Bridge 0.6 leaves it "
                "None: training/utils/packed_seq_utils.py get_packed_seq_params), then validate "
                f"with {PAD_KEY}=true")


def _on(f: Facts) -> bool:
    return f.packed and f.te and f.cp > 1


def te_thd(f: Facts):
    if not (_on(f) and f.hcp and f.te_version is not None and f.te_version < TE_THD_HCP):
        return None
    found = (f"packed sequences (THD) with a2a+p2p need Transformer Engine >= "
             f"{vtext(TE_THD_HCP)} (TE #3290), found {vtext(f.te_version)}: TE up to 2.18 "
             f"asserts against it; {SHIPS}")
    floor = (f"Transformer Engine >= {vtext(TE_THD_HCP)}: "
             "pip install 'transformer-engine[pytorch]>=2.19'")
    if f.te_version < TE_PAD_BY_IDENTITY:  # p2p is no way out here: rule thd-pad-detect
        return found, floor
    return found, f"model.cp_comm_type=p2p{drop_sizes(f)} (or {floor})"


def thd_te_unknown(f: Facts):
    if not (_on(f) and f.te_version is None and f.ring):
        return None
    if f.hcp:  # plan prints it on every such row: kept short
        found = (f"packed (THD) with a2a+p2p needs TE >= {vtext(TE_THD_HCP)} (TE #3290; NeMo "
                 "26.08/26.08.01 ship 2.18)")
    else:
        found = ("packed (THD) with p2p: TE <= 2.17.1 is silently wrong unless "
                 "pad_between_seqs=True (TE #3331); 2.18 on takes a slower exact path (TE #3487)")
    return found, "validate te_version=X.Y.Z (the container's TE)"


def thd_pad_detect(f: Facts):
    if not (_on(f) and f.ring and f.te_version is not None) or f.pad_between_seqs:
        return None
    ring = "/".join(f.ring)
    if f.pad_between_seqs is False:
        return (f"pad_between_seqs=False with packed documents padded to 2*cp = {2 * f.cp} and "
                f"cp_comm_type={ring}: TE's ring then takes the no-padding path, whose per-step "
                "sequence lengths (cu_seqlens // cp) mislabel the chunk boundaries: silently "
                "wrong, nondeterministic attention (TE #3331)",
                f"{PAD_KEY}=true in the forward step's PackedSeqParams (or leave it unset on "
                f"Transformer Engine >= {vtext(TE_PAD_BY_IDENTITY)})")
    if f.te_version >= TE_PAD_BY_IDENTITY:
        return None
    return (f"Transformer Engine {vtext(f.te_version)} (before 2.18) with packed sequences "
            f"(THD) and cp_comm_type={ring}: Bridge leaves pad_between_seqs to TE, which compares "
            "cu_seqlens_padded[:-1] with cu_seqlens[:-1] and misses tail padding, so a pack "
            "whose only padded document is the last takes the no-padding path: silently wrong, "
            "nondeterministic attention and gradients (TE #3331)",
            f"Transformer Engine >= {vtext(TE_PAD_BY_IDENTITY)} (it takes the exact path for "
            f"Bridge's separate padded tensor), or {FORWARD_STEP}")


def thd_padded_identity(f: Facts):
    separate = f.pad_multiple is None or f.pad_multiple > 1
    if not (_on(f) and f.ring and separate and f.pad_between_seqs is None):
        return None
    if f.te_version is None or f.te_version < TE_PAD_BY_IDENTITY:
        return None
    return (f"Transformer Engine {vtext(f.te_version)} decides pad_between_seqs by object "
            "identity (cu_seqlens_q_padded is cu_seqlens_q; from 2.18, TE #2898); Bridge's packer "
            "passes a padded tensor of its own, so every pack takes the exact per-rank path, "
            "slower than 2.17's where the padded and unpadded offsets are equal (TE #3487, open):"
            " a 2.17 -> 2.18+ regress of packed layouts shows it", "")


def _odd_heads(f: Facts) -> str:
    r = f.per_rank()
    if r is None:
        return ""
    return " and ".join(f"{w} heads/tp = {n * f.tp}/{f.tp} = {n}"
                        for w, n in (("query", r[0]), ("KV", r[1])) if n % 2)


def thd_no_backend(f: Facts):
    on = sorted({"a2a", "a2a+p2p"} & set(f.comm_types))
    odd = _odd_heads(f)
    if not (_on(f) and on and odd) or f.pad_between_seqs is False:
        return None
    if f.te_version is not None and f.te_version < TE_EVEN_HEADS:
        return None
    return (f"odd per-TP-rank {odd} with packed sequences (THD) padded between documents and "
            f"cp_comm_type={'/'.join(on)}: TE turns FlashAttention 2/4 and unfused attention "
            "off (padding between sequences; FA4 and unfused never run under CP) and "
            "FusedAttention off (odd heads under a2a): no backend is left (FlashAttention 3 "
            f"alone, on Hopper with flash-attn 3 installed, TE >= {vtext(TE_FA3_PADDED)}, "
            "TE #2596)",
            "model.cp_comm_type=p2p" + drop_sizes(f))


def thd_doc_padding(f: Facts):
    if not (f.packed and f.cp > 1):
        return None
    unit = 2 * f.cp
    mult = f.pad_multiple if f.pad_multiple and f.pad_multiple != unit else None
    cost = (f"this mix gains {f.pad_overhead:.2%} padding tokens" if f.pad_overhead is not None
            else "the cost depends on the document lengths (plan with data.packing=thd "
                 "data.lengths=FILE|preset prints it)")
    return (f"every packed document is padded to a multiple of 2*cp = {unit} tokens"
            + (f" (here {mult}: pad_seq_to_mult)" if mult else "")
            + " (rank r holds chunks r and 2*cp-1-r of each: TE thd_get_partitioned_indices; "
            f"Bridge pads itself, recipe_runner.py sync_offline_packing_alignment); {cost}", "")
