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
from kev.model.gptq import gptq_weights
from kev.model.llama import LlamaModel
from kev.model.model_config import ModelConfig
from kev.model.model_store import cache_root
from kev.model.gguf_weights import attach_gguf, finish_quant_biases
from kev.model.linear import Linear
from kev.model.quantize import (attach_scales, cache_path, quantize_state, read_cached, split_scales, to_w8a8,
                                write_cache)
from kev.model.smoothing import (CALIBRATION, Smoothing, activation_maxima, default_smoothing, search_alphas,
                                 search_clips, smooth_state)
from kev.model.tokenizer import Tokenizer

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Hugging Face names that Kev stores fused: (fused suffix, parts in order).
_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def load_model(folder: Path, precision: str, device: torch.device, max_positions: int,
               gguf: Path | None = None) -> LlamaModel:
    """precision: fp32 | bf16 | fp16 | int8 (weight-only; the quantized weights are cached, kev/model/quantize.py) |
    w8a8 (int8 weights and activations) | gguf (the blocks of `gguf`, the file `folder` was converted from)."""
    cfg = ModelConfig.from_folder(folder)
    with torch.device("meta"):
        model = model_class(cfg)(cfg, max_positions)
    if precision == "gguf":
        if gguf is None:
            raise UnsupportedModelError(f"{folder}: core.precision gguf needs a .gguf model (this is a folder)")
        return _finish_gguf(model, gguf, device)
    smoothing = default_smoothing() if precision == "w8a8" else None
    int8_file = (cache_path(folder, cache_root(), smoothing.tag if smoothing else "")
                 if precision in ("int8", "w8a8") else None)
    state = read_cached(int8_file) if int8_file else None
    if state is None:
        state = _to_kev_names(_read_safetensors(folder), cfg)
        missing = set(model.state_dict()) - set(state)
        if missing:
            raise UnsupportedModelError(f"{folder}: the checkpoint lacks weights {sorted(missing)[:5]}")
        scales = _smooth(state, folder, cfg, smoothing) if smoothing else None
        if int8_file:
            state = quantize_state(state, model, scales)
            write_cache(int8_file, state)
    model = _finish(model, state, precision, device)
    if precision == "w8a8":
        to_w8a8(model)
        model.smoothing = smoothing.tag if smoothing else None
        model.calibration_ids = Tokenizer.from_folder(folder).encode(CALIBRATION.read_text(encoding="utf-8"))
    return model


def _smooth(state: dict[str, torch.Tensor], folder: Path, cfg: ModelConfig, smoothing: Smoothing
            ) -> dict[str, torch.Tensor] | None:
    """w8a8's SmoothQuant fold (kev/model/smoothing.py): maxima from one fp32 forward of the calibration text on a
    model sharing `state`'s tensors, then the factors folded into `state`. Then, on a second forward of the smoothed
    weights, either GPTQ (smoothing.gptq, kev/model/gptq.py: each layer linear's weight in `state` replaced by its
    int8 grid values) or the clip search (smoothing.clip, search_clips); returns the weight scale per output row of
    every layer linear they chose, or None (max|w| / 127 for every linear)."""
    ids = Tokenizer.from_folder(folder).encode(smoothing.text)
    with torch.device("meta"):
        calibration = model_class(cfg)(cfg, len(ids))
    calibration = _finish(calibration, state, "fp32", torch.device("cpu"))
    if smoothing.grid:  # α per layer and fold, searched on the same forward
        stats, per_layer, _ = search_alphas(calibration, ids, smoothing.grid, smoothing.rows, smoothing.outputs)
        smooth_state(state, calibration, stats, per_layer)
    elif smoothing.alphas:
        smooth_state(state, calibration, activation_maxima(calibration, ids), dict(smoothing.alphas))
    if not smoothing.clip and smoothing.gptq is None:
        return None
    with torch.device("meta"):
        smoothed = model_class(cfg)(cfg, len(ids))
    smoothed = _finish(smoothed, state, "fp32", torch.device("cpu"))
    if smoothing.gptq is None:
        return search_clips(smoothed, ids, smoothing.clip, smoothing.clip_rows)
    scales = {}
    for name, (weight, scale) in gptq_weights(smoothed, ids, damp=smoothing.gptq).items():
        state[name + ".weight"], scales[name] = weight, scale
    return scales


def _finish_gguf(model: LlamaModel, gguf: Path, device: torch.device) -> LlamaModel:
    """The GGUF's linear weights in their blocks, the rest (norms) from the file in the compute dtype."""
    cfg = model.config
    dense = attach_gguf(model, gguf, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.tie_word_embeddings)
    held = {name + ".weight" for name, m in model.named_modules() if isinstance(m, Linear) and m.packed is not None}
    missing = set(model.state_dict()) - set(dense) - held
    if missing:
        raise UnsupportedModelError(f"{gguf}: the file lacks weights {sorted(missing)[:5]}")
    model.load_state_dict(dense, strict=False, assign=True)
    dtype = DTYPES[activation_precision("gguf", str(device))]
    model = model.to(device=device, dtype=dtype).eval()
    finish_quant_biases(model)
    model.rope = model.make_rope().to(device, dtype)
    return model


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
    model = _finish(model, quantize_state(state, model) if precision in ("int8", "w8a8") else state, precision, device)
    if precision == "w8a8":
        to_w8a8(model)
        model.calibration_ids = torch.randint(cfg.vocab_size, (512,), generator=generator).tolist()
    return model


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
