"""ModelConfig: the shapes of a Llama-family decoder, read from a Hugging Face config.json."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kev.errors import UnsupportedModelError

SUPPORTED_ARCHITECTURES = {"llama", "qwen2", "mistral"}


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    model_type: str = "llama"

    @property
    def num_params(self) -> int:
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attn = h * (self.num_heads * self.head_dim) * 2 + h * kv * 2
        mlp = 3 * h * self.intermediate_size
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * (attn + mlp + 2 * h) + embed + h

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        model_type = raw.get("model_type", "llama")
        if model_type not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(f"config.json: model_type {model_type!r} is not supported "
                                        f"(supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))})")
        num_heads = raw["num_attention_heads"]
        # transformers >= 5 writes rope_parameters (theta inside); older configs rope_theta + rope_scaling.
        rope = raw.get("rope_parameters") or {}
        theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        scaling = raw.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-5),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=raw.get("max_position_embeddings", 4096),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            # Qwen2 always has q/k/v biases; Llama has them only when attention_bias says so.
            attention_bias=raw.get("attention_bias", model_type == "qwen2"),
            eos_token_ids=eos_ids,
            model_type=model_type,
        )

    @classmethod
    def from_folder(cls, folder: Path) -> ModelConfig:
        return cls.from_hf_dict(json.loads((folder / "config.json").read_text()))
