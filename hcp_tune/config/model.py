"""Model specs: the transformer dimensions that decide which layouts are legal and fast."""
from __future__ import annotations

from dataclasses import dataclass, field

from hcp_tune.config.schema import from_mapping
from hcp_tune.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str = field(metadata={"doc": "spec name, as selected with model=NAME"})
    layers: int = field(metadata={"doc": "transformer layers"})
    hidden: int = field(metadata={"doc": "hidden size"})
    ffn_hidden: int = field(metadata={"doc": "MLP inner size"})
    heads: int = field(metadata={"doc": "query attention heads"})
    kv_heads: int = field(metadata={"doc": "key/value heads (query groups); = heads without GQA"})
    head_dim: int = field(metadata={"doc": "size of one head"})
    vocab: int = field(metadata={"doc": "vocabulary size"})

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ConfigError(
                f"model {self.name}: heads ({self.heads}) must be a multiple of "
                f"kv_heads ({self.kv_heads})"
            )

    @property
    def params(self) -> int:
        """Parameter count (untied embeddings, SwiGLU MLP, no biases)."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = 3 * self.hidden * self.ffn_hidden
        return self.layers * (attn + mlp + 2 * self.hidden) + 2 * self.vocab * self.hidden


def model_from_mapping(data: object, name: str) -> ModelSpec:
    if isinstance(data, dict) and "name" not in data:
        data = {**data, "name": name}
    return from_mapping(ModelSpec, data, "model", f"model/{name}.yaml")
