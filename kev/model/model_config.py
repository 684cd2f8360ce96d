"""ModelConfig: the shapes of a Llama-family decoder, read from a Hugging Face config.json.

Family differences that are shapes or constants (q/k norms, partial rotary, sliding windows,
soft-capping) are fields here; which module classes run them is kev/model/families.py.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kev.errors import DamagedModelError, UnsupportedModelError

# Kept in sync with kev/model/families.py (FAMILIES), which maps each to its model class.
SUPPORTED_ARCHITECTURES = {"llama", "qwen2", "mistral", "qwen3", "gemma2", "gemma3_text", "phi3"}
# The MLP activation each family's code runs (Hugging Face names): SiLU, or tanh-approximated GELU (Gemma's GeGLU).
GELU_FAMILIES = {"gemma2", "gemma3_text"}
# Gemma's default sliding layers when config.json has no layer_types: all but every n-th.
_GEMMA_FULL_EVERY = {"gemma2": 2, "gemma3_text": 6}


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
    # Per layer: the sliding window (keys a query sees, itself included), None for full attention; () when all full.
    layer_windows: tuple[int | None, ...] = ()
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before rotary
    partial_rotary_factor: float = 1.0  # Phi-3 family: rotary on the first head_dim * factor dims only
    hidden_activation: str = "silu"
    query_pre_attn_scalar: float | None = None  # Gemma: scores scaled by this ** -0.5 instead of head_dim ** -0.5
    attn_logit_softcapping: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap)
    final_logit_softcapping: float | None = None  # Gemma 2: logits -> cap * tanh(logits / cap)
    local_rope_theta: float | None = None  # Gemma 3: sliding layers' rotary base (unscaled); None: rope_theta

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def num_params(self) -> int:
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attn = h * (self.num_heads * self.head_dim) * 2 + h * kv * 2
        mlp = 3 * h * self.intermediate_size
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        norms = (4 if self.model_type.startswith("gemma") else 2) * h + (2 * self.head_dim if self.qk_norm else 0)
        return self.num_layers * (attn + mlp + norms) + embed + h

    @property
    def linear_params(self) -> int:
        """Parameters in linear layers (the token table included): what core.precision int8 stores as int8."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        per_layer = h * (self.num_heads * self.head_dim) * 2 + h * kv * 2 + 3 * h * self.intermediate_size
        return self.num_layers * per_layer + self.vocab_size * h * (1 if self.tie_word_embeddings else 2)

    @property
    def linear_outputs(self) -> int:
        """Output channels of the linear layers: one int8 scale each."""
        q, kv, h = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.hidden_size
        per_layer = q + 2 * kv + h + 2 * self.intermediate_size + h
        return self.num_layers * per_layer + self.vocab_size * (1 if self.tie_word_embeddings else 2)

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        model_type = raw.get("model_type", "llama")
        if model_type not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(f"config.json: model_type {model_type!r} is not supported "
                                        f"(supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))})")
        if raw.get("use_bidirectional_attention"):
            raise UnsupportedModelError("config.json: use_bidirectional_attention is not supported (Kev runs "
                                        "causal decoders only)")
        num_heads = raw["num_attention_heads"]
        # transformers >= 5 writes rope_parameters (theta inside); older configs rope_theta + rope_scaling.
        rope = raw.get("rope_parameters") or {}
        # Gemma 3 keeps one set per layer type: the full-attention layers' is the model's rope_theta/scaling.
        local_rope = rope.get("sliding_attention") or {}
        rope = rope.get("full_attention", rope)
        theta = rope.get("rope_theta", raw.get("rope_theta", 10000.0))
        scaling = raw.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        runs = "gelu_pytorch_tanh" if model_type in GELU_FAMILIES else "silu"
        activation = raw.get("hidden_activation") or raw.get("hidden_act", runs)
        if activation != runs:
            raise UnsupportedModelError(f"config.json: hidden activation {activation!r} is not supported for "
                                        f"model_type {model_type!r} (supported: {runs})")
        is_gemma = model_type.startswith("gemma")
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
            tie_word_embeddings=raw.get("tie_word_embeddings", is_gemma),  # Gemma ties by default
            # Qwen2 always has q/k/v biases; Llama has them only when attention_bias says so.
            attention_bias=raw.get("attention_bias", model_type == "qwen2"),
            eos_token_ids=eos_ids,
            model_type=model_type,
            layer_windows=_layer_windows(raw, model_type),
            qk_norm=model_type in ("qwen3", "gemma3_text"),
            # Only the Phi-3 family runs partial rotary (Llama's fused rotary kernel turns whole heads).
            partial_rotary_factor=(rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
                                   if model_type == "phi3" else 1.0),
            hidden_activation=activation,
            query_pre_attn_scalar=raw.get("query_pre_attn_scalar") if is_gemma else None,
            attn_logit_softcapping=raw.get("attn_logit_softcapping"),
            final_logit_softcapping=raw.get("final_logit_softcapping"),
            local_rope_theta=(local_rope.get("rope_theta", raw.get("rope_local_base_freq", 10000.0))
                              if model_type == "gemma3_text" else None),
        )

    @classmethod
    def from_folder(cls, folder: Path) -> ModelConfig:
        path = folder / "config.json"
        raw = read_model_json(path)
        try:
            return cls.from_hf_dict(raw)
        except KeyError as err:
            raise UnsupportedModelError(f"{path}: it has no {err.args[0]!r}, which a model config needs") from None


def read_model_json(path: Path) -> dict[str, Any]:
    """One JSON file of a model folder (config.json, tokenizer_config.json, ...) as an object. A damaged one (a user's
    Hugging Face folder, or an older Kev's cache without a manifest) is one line naming it, not a JSONDecodeError."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise DamagedModelError(f"{path}: not valid JSON ({err}); the file is damaged or truncated: restore it, "
                                f"or download or convert the model again") from None
    if not isinstance(raw, dict):
        raise DamagedModelError(f"{path}: a JSON {type(raw).__name__}, not an object; the file is damaged: restore "
                                f"it, or download or convert the model again")
    return raw


def _layer_windows(raw: dict[str, Any], model_type: str) -> tuple[int | None, ...]:
    """Which layers slide, as transformers decides it: config.json's layer_types when written, else the family's
    rule (Mistral and Phi-3 slide everywhere; Qwen only with use_sliding_window, from max_window_layers on;
    Gemma on all layers but every n-th: n is 2 for Gemma 2, sliding_window_pattern (6) for Gemma 3)."""
    window, num_layers = raw.get("sliding_window"), raw["num_hidden_layers"]
    if model_type in ("qwen2", "qwen3") and not raw.get("use_sliding_window", False):
        window = None
    if not window or model_type == "llama":
        return ()
    if raw.get("layer_types"):
        sliding = [kind == "sliding_attention" for kind in raw["layer_types"]]
    elif model_type in ("qwen2", "qwen3"):
        sliding = [i >= raw.get("max_window_layers", 28) for i in range(num_layers)]
    elif model_type in _GEMMA_FULL_EVERY:
        every = raw.get("sliding_window_pattern", _GEMMA_FULL_EVERY[model_type])
        sliding = [(i + 1) % every != 0 for i in range(num_layers)]
    else:
        sliding = [True] * num_layers
    return tuple(window if is_sliding else None for is_sliding in sliding)
