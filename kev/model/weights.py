"""Build a model (the class its family runs, kev/model/families.py) from a Hugging Face folder (safetensors)
or with random weights."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from kev.config.precision import activation_precision
from kev.errors import UnsupportedModelError
from kev.model.families import model_class
from kev.model.gemma import fold_norm_weights
from kev.model.llama import LlamaModel
from kev.model.model_config import ModelConfig
from kev.model.model_store import cache_root
from kev.model.quantize import attach_scales, cache_path, quantize_state, read_cached, split_scales, write_cache

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Hugging Face names that Kev stores fused: (fused suffix, parts in order).
_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def load_model(folder: Path, precision: str, device: torch.device, max_positions: int) -> LlamaModel:
    """precision: fp32 | bf16 | fp16 | int8 (weight-only; the quantized weights are cached, kev/model/quantize.py)."""
    cfg = ModelConfig.from_folder(folder)
    with torch.device("meta"):
        model = model_class(cfg)(cfg, max_positions)
    int8_file = cache_path(folder, cache_root()) if precision == "int8" else None
    state = read_cached(int8_file) if int8_file else None
    if state is None:
        state = _to_kev_names(_read_safetensors(folder), cfg)
        missing = set(model.state_dict()) - set(state)
        if missing:
            raise UnsupportedModelError(f"{folder}: the checkpoint lacks weights {sorted(missing)[:5]}")
        if int8_file:
            state = quantize_state(state, model)
            write_cache(int8_file, state)
    return _finish(model, state, precision, device)


def random_model(cfg: ModelConfig, precision: str, device: torch.device, max_positions: int,
                 seed: int = 0) -> LlamaModel:
    """Random weights of the given shapes, for benchmarks of models we do not ship."""
    generator = torch.Generator().manual_seed(seed)
    model = model_class(cfg)(cfg, max_positions)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):  # every RMSNorm, q/k norms included (Gemma's folded 1 + w: w = 0)
            param.data.fill_(1.0)
        else:
            param.data.normal_(0.0, 0.02, generator=generator)
    state = model.state_dict()
    return _finish(model, quantize_state(state, model) if precision == "int8" else state, precision, device)


def _finish(model: LlamaModel, state: dict[str, torch.Tensor], precision: str, device: torch.device) -> LlamaModel:
    """Loads state (int8 scales included) into model, then casts floats to the compute dtype on device."""
    state, scales = split_scales(state)
    model.load_state_dict(state, strict=True, assign=True)
    dtype = DTYPES[activation_precision(precision, str(device))]
    model = model.to(device=device, dtype=dtype).eval()  # int8 weights keep their dtype: .to casts floats only
    if scales:
        attach_scales(model, scales, device)
    model.rope = model.make_rope().to(device, dtype)  # rebuilt: a model made on the meta device has no table
    return model


def _read_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UnsupportedModelError(f"{folder}: no *.safetensors weights (Kev reads safetensors, or a .gguf file)")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(file, framework="pt") as handle:
            for key in handle.keys():
                tensors[key] = handle.get_tensor(key)
    return tensors


def _to_kev_names(tensors: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    state = {name.removeprefix("model."): t.float() for name, t in tensors.items()}
    for layer in range(cfg.num_layers):
        prefix = f"layers.{layer}."
        for fused, parts in _FUSED.items():
            if prefix + fused + ".weight" in state:
                continue  # stored fused already (Phi-3)
            state[prefix + fused + ".weight"] = torch.cat([state.pop(prefix + p + ".weight") for p in parts])
            if all(prefix + p + ".bias" in state for p in parts):
                state[prefix + fused + ".bias"] = torch.cat([state.pop(prefix + p + ".bias") for p in parts])
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    state = {k: v for k, v in state.items() if "rotary_emb" not in k}
    if cfg.model_type.startswith("gemma"):
        fold_norm_weights(state)
    return state
