"""core.precision int8: weight-only, symmetric, one scale per output channel (w8a8: the same weights, times
per-row int8 activations on cpu_kernels/w8a8_gemm.cpp).

Every Linear's weight (the token table included: a tied model's head is the table) becomes int8 with
an fp32 scale per row, W ≈ q · scale. Activations, norms and K/V stay in the compute dtype (bf16; fp16
on CUDA without bf16). Quantizing happens once per model: the result is cached as safetensors under
$KEV_CACHE_DIR/int8, keyed by the source weights' files, so the next load reads half the bytes and
skips the rounding. Each cache file has a manifest beside it (`<name>.safetensors.kev-manifest.json`, as the
converted model cache: kev/model/cache_manifest.py), checked at every load: a damaged file is quantized again.
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from kev.model.cache_manifest import file_manifest, find_damage, write_manifest
from kev.model.linear import Linear
from kev.model.llama import LlamaModel
from kev.model.quant_weight import pack_w8a8

SCALE_SUFFIX = ".scale"
log = logging.getLogger(__name__)


def quantize_rows(weight: torch.Tensor, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 q, fp32 scale) with weight ≈ q · scale[:, None]: each row's largest magnitude maps to 127, or the scale
    given (w8a8's clip search, kev/model/smoothing.py: the few weights beyond 127 · scale saturate at ±127)."""
    w = weight.float()
    if scale is None:
        scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
    return torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8), scale


def to_w8a8(model: LlamaModel) -> None:
    """core.precision w8a8: every int8 Linear but the head (weight and per-column scale from quantize_rows) moves onto
    the w8a8 kernel (cpu_kernels/w8a8_gemm.cpp: per-row int8 activations, one int32 sum over all of K); one copy is
    kept."""
    # The head (a tied model's token table) stays int8 weight-only, as vLLM's w8a8 checkpoints keep lm_head out of
    # int8 activations: its logits are what sampling reads, and per-token int8 there costs perplexity.
    head = model.lm_head if model.lm_head is not None else model.embed_tokens
    for module in model.modules():
        if isinstance(module, Linear) and module.scale is not None and module is not head:
            module.packed = pack_w8a8(module.weight.data, module.scale, module.bias)
            module.weight = nn.Parameter(module.weight.data.new_empty(0), requires_grad=False)
            module.scale = None


def linear_names(model: LlamaModel) -> list[str]:
    return [name for name, module in model.named_modules() if isinstance(module, Linear)]


def quantize_state(state: dict[str, torch.Tensor], model: LlamaModel,
                   scales: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The state with every Linear's weight int8 and its scale beside it (as `<linear>.scale`); scales: {linear name:
    scale per output row} for the linears whose scale was searched (w8a8's clip search), the others max|w| / 127."""
    out = dict(state)
    for name in linear_names(model):
        given = scales.get(name) if scales else None
        out[f"{name}.weight"], out[name + SCALE_SUFFIX] = quantize_rows(state[f"{name}.weight"], given)
    return out


def split_scales(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the module state, {linear name: scale})."""
    scales = {k.removesuffix(SCALE_SUFFIX): v for k, v in state.items() if k.endswith(SCALE_SUFFIX)}
    return {k: v for k, v in state.items() if not k.endswith(SCALE_SUFFIX)}, scales


def attach_scales(model: LlamaModel, scales: dict[str, torch.Tensor], device: torch.device) -> None:
    for name, module in model.named_modules():
        if isinstance(module, Linear):
            module.scale = scales[name].float().to(device)


def cache_path(folder: Path, cache: Path, transform: str = "") -> Path:
    """Where a folder's int8 weights are kept: keyed by its weight files' names, sizes and times, and by the transform
    applied before quantizing (w8a8's smoothing tag, kev/model/smoothing.py; "" for none)."""
    digest = hashlib.sha256(str(folder.resolve()).encode())
    for file in sorted(folder.glob("*.safetensors")):
        st = file.stat()
        digest.update(f"{file.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    name = f"{folder.name}-{digest.hexdigest()[:12]}" + (f"-{transform}" if transform else "")
    return cache / "int8" / f"{name}.safetensors"


def read_cached(path: Path) -> dict[str, torch.Tensor] | None:
    """The cached int8 weights, or None (then they are quantized again and the cache rewritten). The file is trusted
    only if its manifest (written last, beside it: kev/model/cache_manifest.py, KEV_CACHE_VERIFY honoured) says so:
    a damaged file, or one without a manifest (an interrupted write, an older Kev's), is discarded with one line."""
    if not path.is_file():
        return None
    manifest = path.parent / file_manifest(path)
    damage = find_damage(path.parent, manifest=manifest.name)
    if damage is None:
        try:
            return load_file(path)
        except Exception as err:  # noqa: BLE001 - safetensors' own error: a file KEV_CACHE_VERIFY let through
            damage = f"safetensors cannot read it ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
    log.warning("int8 weight cache %s: %s; quantizing the weights again", path, damage)
    manifest.unlink(missing_ok=True)
    path.unlink(missing_ok=True)
    return None


def write_cache(path: Path, state: dict[str, torch.Tensor]) -> None:
    """Written to a temporary name first: a half-written file is never read as a cache; its manifest comes last."""
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / file_manifest(path)).unlink(missing_ok=True)  # never an old manifest beside a new file
    partial = path.with_suffix(".partial")
    save_file({k: v.contiguous() for k, v in state.items()}, str(partial))
    partial.replace(path)
    write_manifest(path.parent, [path.name], file_manifest(path))
