"""Pipeline parallelism and activation recompute as the cost model sees them: layers per
stage, the 1F1B schedule's bubble and in-flight micro-batches, and what Bridge's recompute
settings save and cost. Pure arithmetic over numbers; standard library only.

- Layers per stage: ``layers / pp`` (the plain case Megatron asserts divisible, rules.py
  ``layers-pp``); the first stage also holds the input embedding, the last the output layer.
- 1F1B (Megatron's default non-interleaved schedule, ``forward_backward_pipelining_without_
  interleaving``): with ``m`` micro-batches a step takes ``(m + pp - 1)`` micro-batch slots
  of one stage, so the idle fraction (the bubble) is ``(pp-1)/(m+pp-1)``; stage ``s`` keeps
  the activations of ``min(pp - s, m)`` micro-batches alive, the first stage the most.
- Recompute (Megatron-Core ``TransformerConfig``): ``selective`` recomputes the core
  attention (``recompute_modules`` default ``["core_attn"]``): its saved output is dropped and
  its forward runs again in backward; ``full`` + ``uniform`` checkpoints chunks of
  ``recompute_num_layers`` layers (only each chunk's input is kept, plus one chunk's full
  activations while it is recomputed); ``full`` + ``block`` recomputes the first
  ``recompute_num_layers`` layers of each stage and keeps the rest. Every recomputed layer
  runs its forward twice: the extra time is its forward, a third of forward + backward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FORWARD_SHARE = 1 / 3  # forward FLOPs / (forward + backward): backward is twice the forward


@dataclass(frozen=True)
class Recompute:
    """Bridge's ``recompute_granularity`` / ``recompute_method`` / ``recompute_num_layers``."""

    granularity: Literal["none", "selective", "full"] = "none"
    method: Literal["uniform", "block"] = "uniform"
    num_layers: int | None = None  # null: 1 (uniform) or all of a stage's layers (block)

    def __post_init__(self) -> None:
        if self.granularity not in ("none", "selective", "full"):
            raise ValueError(f"recompute={self.granularity!r}: expected none, selective or full")
        if self.method not in ("uniform", "block"):
            raise ValueError(f"recompute_method={self.method!r}: expected uniform or block")
        if self.num_layers is not None and self.num_layers < 1:
            raise ValueError(f"recompute_num_layers must be >= 1, but got {self.num_layers=}.")

    def chunk(self, stage_layers: int) -> int:
        """Layers per checkpointed chunk (uniform) or recomputed layers (block) in a stage."""
        if self.method == "uniform":
            return min(stage_layers, self.num_layers or 1)
        return min(stage_layers, self.num_layers or stage_layers)

    def bridge_overrides(self) -> list[str]:
        if self.granularity == "none":
            return []
        out = [f"model.recompute_granularity={self.granularity}"]
        if self.granularity == "full":
            out += [f"model.recompute_method={self.method}",
                    f"model.recompute_num_layers={self.num_layers or 1}"]
        return out


def stage_layers(layers: int, pp: int) -> int:
    """Transformer layers one stage holds (rounded up when pp does not divide them)."""
    return -(-layers // pp)


def bubble_fraction(pp: int, micro_batches: int) -> float:
    """1F1B idle fraction of a step: (pp-1)/(m+pp-1)."""
    return (pp - 1) / (micro_batches + pp - 1)


def in_flight(pp: int, micro_batches: int) -> int:
    """Micro-batches whose activations the first stage holds at once under 1F1B."""
    return max(1, min(pp, micro_batches))


def saved_activations(layer_bytes: float, input_bytes: float, attn_out_bytes: float,
                      n_layers: int, rc: Recompute) -> float:
    """Bytes one micro-batch keeps for ``n_layers`` layers: ``layer_bytes`` each without
    recompute, minus the attention output (selective), or only chunk inputs plus one
    chunk's full activations (full uniform), or the recomputed block's inputs (full block)."""
    if rc.granularity == "none":
        return n_layers * layer_bytes
    if rc.granularity == "selective":
        return n_layers * (layer_bytes - attn_out_bytes)
    k = rc.chunk(n_layers)
    if rc.method == "uniform":
        chunks = -(-n_layers // k)
        return chunks * input_bytes + k * layer_bytes
    return k * input_bytes + (n_layers - k) * layer_bytes + min(k, 1) * layer_bytes


def recomputed_layers(n_layers: int, rc: Recompute) -> int:
    """Layers whose whole forward runs again in backward (full recompute)."""
    if rc.granularity != "full":
        return 0
    return n_layers if rc.method == "uniform" else rc.chunk(n_layers)
