"""SmoothQuant for core.precision w8a8: per-channel smoothing folded into the weights once, at load.

w8a8 quantizes each activation row with one scale (its largest magnitude / 127), so a few input channels that are
always large (outliers, typical right after a norm) leave the other channels few levels. SmoothQuant (Xiao et al.,
2023) divides input channel j by s_j = max|X_j|^α / max|W_j|^(1-α) and multiplies the weight's column j by s_j:
X W^T is unchanged, the activation's range is flattened and part of it moves into the weight, whose scale is per
output row. The division is folded into what makes X, so nothing is computed at run time:

- q/k/v and gate/up: into the RMSNorm weight before them (its output is x̂ · w, so w / s gives X / s);
- o_proj: into v's rows (attention output channel (head h, d) is a mix of v's channel (kv head h // group, d) over
  positions, so one s per kv-head channel, the o columns of every head in the group times that s; v's bias too);
- down_proj: into up's rows (act(gate) · up / s = (act(gate) · up) / s, whatever the activation).

Each fold is exact in real arithmetic. The head stays out (int8 weight-only: kev/model/quantize.py's to_w8a8), and
so does the final norm. max|X_j| comes from one fp32 forward of Kev's own model over a fixed calibration text that
ships with Kev (calibration/smoothing.txt, written for this, never the held-out text quality is measured on).
Smoothing is a weight transform: every row still runs the same row-invariant kernel, bit-identical to solo.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kev.model.attention import PagedKVLayer
from kev.model.gemma import GemmaLayer
from kev.model.linear import Linear
from kev.model.llama import LlamaModel
from kev.model.step_metadata import ChannelSpan, StepMetadata

CALIBRATION = Path(__file__).parent / "calibration" / "smoothing.txt"
# α per fold, by measurement on the default model (bench/results/w8a8_quality.md, bench/smoothing_sweep.py): the norm
# before q/k/v, the norm before gate/up, v rows into o columns, up rows into down columns. A fold left out is not
# made; None: w8a8 runs unsmoothed (the sweep's baseline).
# Alone (the others int8 weight-only), q/k/v's input loses most to per-token int8 and smooths best at 0.5; gate/up's
# gains nothing from smoothing; down's, the next worst, smooths best at 0.75.
ALPHAS: dict[str, float] | None = {"qkv": 0.5, "o": 0.5, "down": 0.75}
FOLDS = ("qkv", "gate_up", "o", "down")
_TINY = 1e-5  # floor for maxima and factors: a channel that is never used gets s = tiny^α / ..., never 0 or inf


@dataclass(frozen=True)
class Smoothing:
    alphas: tuple[tuple[str, float], ...]  # (fold, α), folds in FOLDS order
    text: str  # the calibration text

    @property
    def tag(self) -> str:
        """Names the transform (cache key, numerics fingerprint): each fold's α and the calibration text's hash."""
        folds = "".join(f"{fold[0]}{alpha:g}" for fold, alpha in self.alphas)  # q0.5g0.5o0.5d0.75
        return f"sq{folds}-{hashlib.sha256(self.text.encode()).hexdigest()[:8]}"


def default_smoothing() -> Smoothing | None:
    if ALPHAS is None:
        return None
    unknown = set(ALPHAS) - set(FOLDS)
    assert not unknown, f"smoothing folds {unknown}: use {FOLDS}"
    return Smoothing(tuple((f, ALPHAS[f]) for f in FOLDS if f in ALPHAS), CALIBRATION.read_text(encoding="utf-8"))


def activation_maxima(model: LlamaModel, ids: list[int]) -> dict[str, torch.Tensor]:
    """{linear name: max |x| per input channel} over one causal forward of `ids` (model in fp32 on the CPU, Kev's
    torch path: no prepacking, no fused layers, so every Linear's forward sees its input)."""
    stats: dict[str, torch.Tensor] = {}

    def record(name: str) -> Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], None]:
        def hook(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            m = args[0].detach().abs().float().reshape(-1, args[0].shape[-1]).amax(0)
            stats[name] = torch.maximum(stats[name], m) if name in stats else m
        return hook

    handles = [module.register_forward_pre_hook(record(name)) for name, module in model.named_modules()
               if isinstance(module, Linear) and name.startswith("layers.")]
    try:
        prompt_logits(model, ids)
    finally:
        for handle in handles:
            handle.remove()
    return stats


def prompt_logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """One causal forward of `ids` as one question's whole prompt in one step: the last row's logits [1, vocab]."""
    rows = torch.arange(len(ids))
    span = ChannelSpan(0, 0, len(ids), len(ids), rows, None, True)
    meta = StepMetadata(torch.tensor(ids), rows, [len(ids)], rows, rows, [span], rows[-1:], [1])
    cfg = model.config
    caches = [PagedKVLayer(len(ids), cfg.num_kv_heads, cfg.head_dim, model.dtype, model.device) for _ in model.layers]
    with torch.no_grad():
        return model.forward(meta, caches)


def _factor(act: torch.Tensor, weight_max: torch.Tensor, alpha: float) -> torch.Tensor:
    return (act.clamp(min=_TINY) ** alpha / weight_max.clamp(min=_TINY) ** (1 - alpha)).clamp(min=_TINY)


def smooth_state(state: dict[str, torch.Tensor], model: LlamaModel, stats: dict[str, torch.Tensor],
                 alphas: dict[str, float]) -> None:
    """Folds the factors into `state` (fp32, Kev's names), in place: no second copy of the weights at load (the model
    `stats` were taken on may hold the same tensors; it is only read for its layer structure after this).
    alphas: {fold: α} (FOLDS)."""
    cfg = model.config
    dim, inter = cfg.head_dim, cfg.intermediate_size
    for i, layer in enumerate(model.layers):
        p = f"layers.{i}."
        mlp_norm = "pre_feedforward_layernorm" if isinstance(layer, GemmaLayer) else "post_attention_layernorm"
        for fold, norm, linear in (("qkv", "input_layernorm", "self_attn.qkv_proj"),
                                   ("gate_up", mlp_norm, "mlp.gate_up_proj")):
            if fold not in alphas:
                continue
            weight = state[p + linear + ".weight"]
            s = _factor(stats[p + linear], weight.abs().amax(0), alphas[fold])
            state[p + norm + ".weight"].div_(s)
            weight.mul_(s)
        if "o" in alphas:
            _fold_v_into_o(state, p, stats[p + "self_attn.o_proj"], cfg.num_heads, cfg.num_kv_heads, dim, alphas["o"])
        if "down" in alphas:  # down_proj's input is act(gate) · up: up's rows carry the division
            down = state[p + "mlp.down_proj.weight"]
            s = _factor(stats[p + "mlp.down_proj"], down.abs().amax(0), alphas["down"])
            _divide_rows(state, p + "mlp.gate_up_proj", inter, s)
            down.mul_(s)


def _fold_v_into_o(state: dict[str, torch.Tensor], p: str, act: torch.Tensor, heads: int, kv_heads: int, dim: int,
                   alpha: float) -> None:
    """o_proj's input channel (head h, d) is v's output channel (kv head h // group, d): one s per kv channel, the
    o columns of every head in the group times it."""
    group = heads // kv_heads
    o_weight = state[p + "self_attn.o_proj.weight"]
    s = _factor(act.view(kv_heads, group, dim).amax(1), o_weight.abs().amax(0).view(kv_heads, group, dim).amax(1),
                alpha).reshape(-1)
    _divide_rows(state, p + "self_attn.qkv_proj", (heads + kv_heads) * dim, s)
    o_weight.mul_(s.view(kv_heads, 1, dim).expand(kv_heads, group, dim).reshape(-1))


def _divide_rows(state: dict[str, torch.Tensor], linear: str, start: int, s: torch.Tensor) -> None:
    """Rows start .. start + len(s) of the linear's weight (and bias) divided by s."""
    for suffix in (".weight", ".bias"):
        if linear + suffix not in state:
            continue
        part = state[linear + suffix][start: start + s.numel()]
        part /= s.view(-1, *([1] * (part.dim() - 1)))
