"""Transformer Engine's DotProductAttention on the trial's CP groups (the CUDA path).

Signature used (TE >= 1.12, as Megatron-Core's TEDotProductAttention calls it):
``DotProductAttention(num_attention_heads, kv_channels, num_gqa_groups=, attention_dropout=,
qkv_format=, attn_mask_type="causal", cp_group=, cp_global_ranks=, cp_stream=, cp_comm_type=)``.
For ``a2a+p2p`` ``cp_group`` is the list ``[a2a_group, p2p_group]`` (level 0 first); for the
``p2p``/``a2a`` baselines it is the flat CP group. ``cp_global_ranks`` are always the flat
CP group's global ranks. TE is imported here only, and only when this path is chosen.

The timed layout defaults to ``sbhd``, the format Megatron-Core's TEDotProductAttention
hands TE in training (``TrialSpec.qkv_format``); ``bshd`` is the other choice.

Packed sequences (``TrialSpec.packing == "thd"``) run ``qkv_format="thd"`` with
``attn_mask_type="padding_causal"``, q/k/v of [t, h, d] (this rank's per-document share,
``attention/packed.py``), and per forward (TE 2.19 ``DotProductAttention.forward``):
``cu_seqlens_q/kv`` (int32, the whole stream's real document offsets; TE splits them per
rank itself), ``cu_seqlens_q/kv_padded`` (offsets of the documents padded to ``2*cp``),
``max_seqlen_q/kv`` (the longest padded document) and ``pad_between_seqs`` **always
explicit** (``thd_forward_kwargs``): TE <= 2.17.1 guesses it from the tensors' values and
gets a tail-padded last document wrong (TE #3331: silently wrong attention under p2p), and
TE >= 2.18 guesses from object identity (``cu_seqlens_q_padded is cu_seqlens_q``; TE
#2898). Where no document is padded the padded tensors are the unpadded ones (the same
objects, as TE's docstring asks), else distinct: equal but distinct tensors take TE's
slower exact path (TE #3487). ``thd_record`` says which ran. Refused before TE runs
(``thd_problem``): TE older than 2.3 (its forward has no ``pad_between_seqs``), and
a2a+p2p on TE older than 2.19 (TE #3290 enabled it; 2.18 asserts it unsupported).

Which kernel TE picked (FlashAttention, FusedAttention sub-backend N, ...) is only told in
its debug log: with ``NVTE_DEBUG=1 NVTE_DEBUG_LEVEL=2`` (read when TE is imported) the
logger ``"DotProductAttention"`` (TE 1.12 .. 2.20, ``get_attention_backend``) emits
``Selected backend = <name>`` at DEBUG. ``BackendLog`` listens there.
"""
from __future__ import annotations

import logging
import os
import re
from typing import Optional

from hcp_tune.spec import TE_MIN_HCP

MIN_TE = ".".join(map(str, TE_MIN_HCP))  # "1.12.0": the first TE with the a2a+p2p path
MIN_CAPABILITY = (8, 0)  # TE has no CP-capable attention backend below sm80
QKV_FORMATS = ("sbhd", "bshd", "thd")  # thd: packed sequences only
MIN_TE_THD = "2.3.0"  # the first DotProductAttention.forward with pad_between_seqs
# THD with a2a+p2p (TE #3290, release_v2.19); the rules' copy is upstream/te_packed.py
# TE_THD_HCP (a test keeps the two equal: the job side cannot import the orchestrator's)
MIN_TE_THD_HCP = "2.19.0"
TE_LOGGER = "DotProductAttention"
_SELECTED = re.compile(r"Selected backend = (.+?)\.?\s*$")


def te_min_version_ok(text: str, minimum: str = MIN_TE) -> bool:
    """``text`` (e.g. "2.17.1+4329ff8", "2.9.0.dev0") is at least ``minimum`` (PEP 440).

    ``packaging`` is a dependency of Megatron-Core, so it is present wherever the job runs.
    """
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text) >= Version(minimum)
    except InvalidVersion:
        return False


def thd_problem(version: str, comm_type: str) -> Optional[str]:
    """Why TE ``version`` cannot run packed sequences (THD) with ``comm_type``, or None."""
    if not te_min_version_ok(version, MIN_TE_THD):
        return (f"transformer_engine {version} is older than {MIN_TE_THD}: packed sequences "
                "(THD) need pad_between_seqs passed explicitly (TE #3331), which "
                "DotProductAttention.forward takes from 2.3; use TE >= 2.19")
    if comm_type == "a2a+p2p" and not te_min_version_ok(version, MIN_TE_THD_HCP):
        return (f"transformer_engine {version} is older than {MIN_TE_THD_HCP}: packed sequences "
                f"(THD) with a2a+p2p need TE >= {MIN_TE_THD_HCP} (TE #3290; 2.18 and earlier "
                "assert it unsupported); use TE >= 2.19, or measure the p2p and a2a layouts")
    return None


def thd_forward_kwargs(stream, device) -> dict:
    """``DotProductAttention.forward``'s THD arguments for a packed stream
    (``attention.packed.PackedStream``): the whole stream's offsets, as every CP rank
    passes them; the padded tensors are the unpadded objects exactly when nothing is
    padded, and ``pad_between_seqs`` says so explicitly."""
    import torch

    pad = stream.pad_between_seqs
    cu = torch.tensor(stream.cu_seqlens(padded=False), dtype=torch.int32, device=device)
    cu_padded = (torch.tensor(stream.cu_seqlens(padded=True), dtype=torch.int32,
                              device=device) if pad else cu)
    longest = max(stream.padded)
    return {"cu_seqlens_q": cu, "cu_seqlens_kv": cu, "cu_seqlens_q_padded": cu_padded,
            "cu_seqlens_kv_padded": cu_padded, "max_seqlen_q": longest,
            "max_seqlen_kv": longest, "pad_between_seqs": pad}


def thd_record(kwargs: dict) -> dict:
    """What a result records of the THD arguments TE was given."""
    return {"pad_between_seqs": kwargs["pad_between_seqs"],
            "cu_seqlens_padded_is_unpadded": (kwargs["cu_seqlens_q_padded"]
                                              is kwargs["cu_seqlens_q"]
                                              and kwargs["cu_seqlens_kv_padded"]
                                              is kwargs["cu_seqlens_kv"])}


def enable_te_debug_log() -> None:
    """Ask TE to log its backend choice; it reads these once, when it is imported."""
    os.environ["NVTE_DEBUG"] = "1"
    os.environ["NVTE_DEBUG_LEVEL"] = "2"


def te_version() -> Optional[str]:
    enable_te_debug_log()  # before the first import of TE in this process
    try:
        import transformer_engine
    except Exception:  # ImportError, or a broken CUDA build raising at import
        return None
    return getattr(transformer_engine, "__version__", "0")


def te_unavailable_reason() -> Optional[str]:
    """Why the TE path cannot run here, or None when it can."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device: the TE path needs a GPU (the torch reference runs instead)"
    ver = te_version()
    if ver is None:
        return "transformer_engine is not installed (or fails to import)"
    if not te_min_version_ok(ver):
        return f"transformer_engine {ver} is older than {MIN_TE}, the first with a2a+p2p"
    return None


def cp_capability_problem(cuda_index: int) -> Optional[str]:
    """Why GPU ``cuda_index`` cannot run TE's CP attention (below sm80), or None."""
    import torch

    major, minor = torch.cuda.get_device_capability(cuda_index)
    if (major, minor) < MIN_CAPABILITY:
        return (f"GPU {cuda_index} is sm{major}{minor}: Transformer Engine has no "
                f"context-parallel attention backend below sm80")
    return None


def parse_selected_backend(message: str) -> Optional[str]:
    """The backend named in TE's ``Selected backend = ...`` log line, else None."""
    m = _SELECTED.search(message)
    return m.group(1).strip() if m else None


class BackendLog(logging.Handler):
    """Collects the backends TE reports selecting, in order (attach with ``attach()``).

    Attached while TE selects, it also keeps TE from adding its own stderr handler (TE
    adds one only to a logger without handlers).
    """

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.selected: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        name = parse_selected_backend(record.getMessage())
        if name:
            self.selected.append(name)

    @property
    def last(self) -> str:
        return self.selected[-1] if self.selected else ""

    def attach(self) -> "BackendLog":
        logger = logging.getLogger(TE_LOGGER)
        if self not in logger.handlers:
            logger.addHandler(self)
        return self

    def detach(self) -> None:
        logging.getLogger(TE_LOGGER).removeHandler(self)


# TE's cache of its backend choice (a module-level dict): TE 2.x keeps it in
# ``attention.dot_product_attention.dot_product_attention``, TE 1.x in ``attention``. TE
# re-selects (and logs) only when the attention parameters change or
# ``backend_selection_requires_update`` is set: a second trial of the same shapes in the
# same processes would otherwise log nothing and record te_backend "".
_TE_CACHE_MODULES = ("transformer_engine.pytorch.attention.dot_product_attention."
                     "dot_product_attention", "transformer_engine.pytorch.attention")


def te_selection_cache() -> Optional[dict]:
    """TE's backend-selection dict, or None when this TE keeps it elsewhere."""
    import importlib

    for name in _TE_CACHE_MODULES:
        try:
            cache = getattr(importlib.import_module(name), "_attention_backends", None)
        except ImportError:
            continue
        if isinstance(cache, dict):
            return cache
    return None


def force_fresh_selection(cache: Optional[dict]) -> None:
    """Make TE select (and log) its backend again at the next forward."""
    if cache is not None and "backend_selection_requires_update" in cache:
        cache["backend_selection_requires_update"] = True


def backend_from_cache(cache: Optional[dict]) -> str:
    """The backend TE's cache says it runs, in its log's words ("" when it says nothing)."""
    if not cache:
        return ""
    if cache.get("use_flash_attention"):
        version = cache.get("flash_attention_backend")
        return f"FlashAttention ({version})" if version else "FlashAttention"
    if cache.get("use_fused_attention"):
        sub = cache.get("fused_attention_backend")
        sub = getattr(sub, "value", sub)  # an enum in TE (FusedAttnBackend)
        return f"FusedAttention (sub-backend {int(sub)})" if sub is not None else "FusedAttention"
    if cache.get("use_unfused_attention"):
        return "UnfusedDotProductAttention"
    return ""


def build_with_log(log: "BackendLog", factory):
    """``factory()`` (the TE module's constructor) with ``log`` already on TE's logger: TE
    adds its own stderr handler to that logger at construction when it has none, and every
    rank would then print TE's debug output."""
    log.attach()
    try:
        return factory()
    finally:
        log.detach()


class TEAttention:
    """Callable on q, k, v in ``qkv_format`` ([s, b, h, d], [b, s, h, d], or [t, h, d] with
    the packed stream they come from), same out."""

    def __init__(self, *, heads: int, kv_heads: int, head_dim: int, groups, comm_type: str,
                 qkv_format: str = "sbhd", cp_off: bool = False):
        if qkv_format not in QKV_FORMATS:
            raise ValueError(f"qkv_format={qkv_format!r}: expected one of {QKV_FORMATS}")
        if qkv_format == "thd" and cp_off:
            raise ValueError("the planted cp_off fault runs on the torch reference only: TE's "
                             "THD path would read the whole stream's offsets on one share")
        enable_te_debug_log()
        import torch
        import transformer_engine.pytorch as te

        kwargs = {}
        if not cp_off and comm_type != "none":
            if comm_type == "a2a+p2p":
                if not groups.hierarchical:
                    raise RuntimeError(
                        "a2a+p2p needs the HCP groups, but Megatron-Core has none "
                        "(hierarchical_context_parallel_sizes not given)"
                    )
                cp_group = [groups.a2a, groups.p2p]
            else:
                cp_group = groups.cp
            kwargs = dict(
                cp_group=cp_group,
                cp_global_ranks=list(groups.cp_ranks),
                cp_stream=torch.cuda.Stream(),
                cp_comm_type=comm_type,
            )
        self.heads, self.head_dim, self.qkv_format = heads, head_dim, qkv_format
        self.log = BackendLog()
        self.layer = build_with_log(self.log, lambda: te.DotProductAttention(
            num_attention_heads=heads,
            kv_channels=head_dim,
            num_gqa_groups=kv_heads,
            attention_dropout=0.0,
            qkv_format=qkv_format,
            # THD asserts a padding mask type; causal within each document
            attn_mask_type="padding_causal" if qkv_format == "thd" else "causal",
            **kwargs,
        ))
        self._cache = te_selection_cache()
        self._fresh = False  # this instance's first forward has made TE select anew
        self._thd: tuple = (None, {})  # (stream, its forward arguments): built once a stream
        self.thd: dict = {}  # thd_record of the latest packed forward

    @property
    def selected_backend(self) -> str:
        """The kernel TE chose for the latest shapes: its log line, else its cache."""
        return self.log.last or backend_from_cache(self._cache)

    def __call__(self, q, k, v, stream=None):
        extra = {}
        if self.qkv_format == "thd":
            if self._thd[0] != stream:  # the tensors are made once per stream, not per step
                self._thd = (stream, thd_forward_kwargs(stream, q.device))
            extra = self._thd[1]
            self.thd = thd_record(extra)
        if not self._fresh:  # once per trial's layer: TE logs its choice again
            force_fresh_selection(self._cache)
            self._fresh = True
        # listen only during this layer's own forward, where TE selects its kernel: another
        # layer's choice (the no-CP reference's) must not be taken for this one's, and
        # handlers must not pile up over trials (a few microseconds per step)
        self.log.attach()
        try:
            out = self.layer(q, k, v, **extra)  # [s, b, h*d], [b, s, h*d] or [t, h*d]
        finally:
            self.log.detach()
        return out.view(*q.shape[:-2], self.heads, self.head_dim)
