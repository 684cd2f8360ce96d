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

α is chosen per layer and fold at load (AUTO, search_alphas: AutoSmoothQuant / Intel Neural Compressor's auto-α):
on the calibration forward each smoothable linear's input X and weight W are smoothed at every α of GRID, both
quantized as the kernel does, and the α (or no smoothing) whose output is nearest X W^T in fp32 is folded.

After the fold, GPTQ (kev/model/gptq.py, GPTQ below) chooses each layer linear's int8 integers on a second forward of
the same text; the scale stays max|w| / 127 per output row.

Each fold is exact in real arithmetic. The head stays out (int8 weight-only: kev/model/quantize.py's to_w8a8), and
so does the final norm. max|X_j| comes from one fp32 forward of Kev's own model over a fixed calibration text that
ships with Kev (calibration/smoothing.txt, written for this, never the held-out text quality is measured on).
Smoothing is a weight transform: every row still runs the same row-invariant kernel, bit-identical to solo.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from kev.model.calibration_forward import hooked_forward
from kev.model.gemma import GemmaLayer
from kev.model.gptq import DAMP
from kev.model.linear import Linear
from kev.model.llama import LlamaModel
from kev.model.quant_weight import quantize_per_row
from kev.model.quantize import quantize_rows

CALIBRATION = Path(__file__).parent / "calibration" / "smoothing.txt"
# α per fold, by measurement on the default model (bench/results/w8a8_quality.md, bench/smoothing_sweep.py): the norm
# before q/k/v, the norm before gate/up, v rows into o columns, up rows into down columns. A fold left out is not
# made; None: w8a8 runs unsmoothed (the sweep's baseline). Used where AUTO is None.
# Alone (the others int8 weight-only), q/k/v's input loses most to per-token int8 and smooths best at 0.5; gate/up's
# gains nothing from smoothing; down's, the next worst, smooths best at 0.75.
ALPHAS: dict[str, float] | None = {"qkv": 0.5, "o": 0.5, "down": 0.75}
FOLDS = ("qkv", "gate_up", "o", "down")
# α chosen per layer and fold by measurement at load (as AutoSmoothQuant and Intel Neural Compressor's auto-α do):
# each grid value and no smoothing at all, the one whose w8a8 output (the calibration activations and the weight
# smoothed, then both quantized as the kernel does) is nearest the fp32 output (mean squared error). None: ALPHAS.
GRID = tuple(round(0.3 + 0.05 * i, 2) for i in range(13))  # 0.3 .. 0.9
AUTO: tuple[float, ...] | None = GRID
# The search's error on every k-th calibration row and every k-th output channel, at most this many of each (the
# maxima, hence the factors, from all of them; the weight is quantized per output channel, so a subset of channels
# quantizes as the whole would): its cost at load, ~14 · 30 · rows · K · outputs multiply-adds on the default model.
SEARCH_ROWS = 256
SEARCH_OUTPUTS = 256
# Each w8a8 linear's weight scale per output row: max|w| · c / 127, c searched per row over CLIP (after smoothing, on a
# second calibration forward of the smoothed model: the row's w8a8 output nearest its fp32 output over CLIP_ROWS
# calibration rows, as AWQ's clip search / llama.cpp's make_qx_quants choose a scale). () for none: c = 1.
# Measured, not kept: 1.0 .. 0.8 by 0.01 over every calibration row took held-out perplexity from 1.0117x bf16 to
# 1.0138x (bench/results/w8a8_quality.md; bench/smoothing_sweep.py --gptq off --clip 1-0.8-0.01 --clip-rows 0).
CLIP: tuple[float, ...] = ()
CLIP_ROWS = 256
# GPTQ's rounding of each w8a8 linear's int8 weight (kev/model/gptq.py), after the smoothing fold: sequential, on the
# same calibration text, with this damping (H's diagonal plus damp · its mean). None: round to nearest.
GPTQ: float | None = DAMP
_TINY = 1e-5  # floor for maxima and factors: a channel that is never used gets s = tiny^α / ..., never 0 or inf


@dataclass(frozen=True)
class Smoothing:
    alphas: tuple[tuple[str, float], ...]  # (fold, α), folds in FOLDS order; unused where grid is set
    text: str  # the calibration text
    grid: tuple[float, ...] = ()  # α searched per layer and fold (every fold, no smoothing a choice too); () for none
    rows: int = 0  # the search's rows at most (search_alphas' max_rows)
    outputs: int = 0  # the search's output channels at most (max_outputs)
    clip: tuple[float, ...] = ()  # clip ratios searched per output row (search_clips); () for none
    clip_rows: int = 0  # the clip search's calibration rows at most
    gptq: float | None = None  # int8 weights rounded by GPTQ at this damping (kev/model/gptq.py); None: to nearest

    @property
    def tag(self) -> str:
        """Names the transform (cache key, numerics fingerprint): each fold's α (or auto and the grid searched) and
        the calibration text's hash."""
        if self.grid:  # sqauto0.3-0.9n13r256h<hash of the whole grid>
            grid = hashlib.sha256(",".join(f"{alpha:g}" for alpha in self.grid).encode()).hexdigest()[:4]
            folds = f"auto{self.grid[0]:g}-{self.grid[-1]:g}n{len(self.grid)}r{self.rows}o{self.outputs}h{grid}"
        else:
            folds = "".join(f"{fold[0]}{alpha:g}" for fold, alpha in self.alphas)  # q0.5g0.5o0.5d0.75
        if self.clip:  # c1-0.8n21r256h<hash of the clip grid>
            grid = hashlib.sha256(",".join(f"{c:g}" for c in self.clip).encode()).hexdigest()[:4]
            folds += f"c{self.clip[0]:g}-{self.clip[-1]:g}n{len(self.clip)}r{self.clip_rows}h{grid}"
        if self.gptq is not None:
            folds += f"gptq{self.gptq:g}"
        return f"sq{folds}-{hashlib.sha256(self.text.encode()).hexdigest()[:8]}"


def default_smoothing() -> Smoothing | None:
    assert not (CLIP and GPTQ is not None), "w8a8: the clip search or GPTQ, not both (GPTQ keeps max|w| / 127)"
    text = CALIBRATION.read_text(encoding="utf-8")
    clip: dict = {"clip": tuple(CLIP), "clip_rows": CLIP_ROWS} if CLIP else {}
    if GPTQ is not None:
        clip["gptq"] = GPTQ
    if AUTO is not None:
        return Smoothing((), text, tuple(AUTO), SEARCH_ROWS, SEARCH_OUTPUTS, **clip)
    if ALPHAS is None:
        return Smoothing((), text, **clip) if clip else None
    unknown = set(ALPHAS) - set(FOLDS)
    assert not unknown, f"smoothing folds {unknown}: use {FOLDS}"
    return Smoothing(tuple((f, ALPHAS[f]) for f in FOLDS if f in ALPHAS), text, **clip)


def activation_maxima(model: LlamaModel, ids: list[int]) -> dict[str, torch.Tensor]:
    """{linear name: max |x| per input channel} over one causal forward of `ids` (model in fp32 on the CPU, Kev's
    torch path: no prepacking, no fused layers, so every Linear's forward sees its input)."""
    stats: dict[str, torch.Tensor] = {}

    def record(name: str) -> Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], None]:
        def hook(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            m = args[0].detach().abs().float().reshape(-1, args[0].shape[-1]).amax(0)
            stats[name] = torch.maximum(stats[name], m) if name in stats else m
        return hook

    hooked_forward(model, ids, record)
    return stats


def _factor(act: torch.Tensor, weight_max: torch.Tensor, alpha: float) -> torch.Tensor:
    return (act.clamp(min=_TINY) ** alpha / weight_max.clamp(min=_TINY) ** (1 - alpha)).clamp(min=_TINY)


def _o_factor(act: torch.Tensor, o_weight: torch.Tensor, kv_heads: int, dim: int, alpha: float) -> torch.Tensor:
    """o_proj's input channel (head h, d) is v's output channel (kv head h // group, d): one s per kv channel
    [kv_heads · dim], from the group's largest activation and weight column."""
    group = act.numel() // (kv_heads * dim)
    return _factor(act.view(kv_heads, group, dim).amax(1),
                   o_weight.abs().amax(0).view(kv_heads, group, dim).amax(1), alpha).reshape(-1)


def _per_head(s: torch.Tensor, heads: int, kv_heads: int, dim: int) -> torch.Tensor:
    """A factor per kv channel -> one per o_proj input channel (each head of the group takes its kv head's)."""
    group = heads // kv_heads
    return s.view(kv_heads, 1, dim).expand(kv_heads, group, dim).reshape(-1)


def w8a8_error(x: torch.Tensor, weight: torch.Tensor, reference: torch.Tensor, s: torch.Tensor | None) -> float:
    """Mean squared error against `reference` (x @ weight^T in fp32) of the w8a8 product of x / s and weight · s,
    both quantized as the kernel does: the weight symmetric per output row (quantize_rows), x per row (max|x| / 127,
    round half to even: quantize_per_row); the integer sum in fp32 (near exact, as good as exact for choosing)."""
    if s is not None:
        x, weight = x / s, weight * s
    qx, dx = quantize_per_row(x)
    qw, scale = quantize_rows(weight)
    out = (qx.float() @ qw.float().t()) * scale
    out *= dx[:, None]
    return float((out - reference).square().mean())


@dataclass
class Choice:
    """What the search saw for one linear: its input's max |x| per channel, the α picked (None: unsmoothed) and the
    error of each candidate."""
    maxima: torch.Tensor
    alpha: float | None
    errors: dict[float | None, float]


def search_alphas(model: LlamaModel, ids: list[int], grid: tuple[float, ...], max_rows: int = SEARCH_ROWS,
                  max_outputs: int = SEARCH_OUTPUTS
                  ) -> tuple[dict[str, torch.Tensor], list[dict[str, float]], dict[str, Choice]]:
    """One causal forward of `ids` (fp32, as activation_maxima); at each smoothable linear its input X and weight
    W give, for every α of `grid` and for no smoothing, the w8a8 error of X W^T (w8a8_error), and the α with the
    least is that layer's and fold's. Returns (the maxima, {fold: α} per layer, folds left unsmoothed left out, and
    each linear's Choice). max_rows, max_outputs > 0: the error on every k-th row and every k-th output channel
    only, at most that many of each (the maxima and the weight's column maxima, hence the factors, on all)."""
    cfg = model.config
    heads, kv_heads, dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    folds = {"self_attn.qkv_proj": "qkv", "mlp.gate_up_proj": "gate_up", "self_attn.o_proj": "o",
             "mlp.down_proj": "down"}
    choices: dict[str, Choice] = {}

    def search(name: str, fold: str) -> Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], None]:
        def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            assert name not in choices, f"{name}: the calibration forward must see each linear once"
            x = args[0].detach().float().reshape(-1, args[0].shape[-1])
            maxima = x.abs().amax(0)
            if max_rows and x.shape[0] > max_rows:
                x = x[:: -(-x.shape[0] // max_rows)]
            assert isinstance(module, Linear)
            full = module.weight.detach().float()
            weight_max = full.abs().amax(0)
            weight = full[:: -(-full.shape[0] // max_outputs)] if max_outputs and full.shape[0] > max_outputs else full
            reference = x @ weight.t()
            errors: dict[float | None, float] = {None: w8a8_error(x, weight, reference, None)}
            for alpha in grid:
                if fold == "o":
                    s = _per_head(_o_factor(maxima, full, kv_heads, dim, alpha), heads, kv_heads, dim)
                else:
                    s = _factor(maxima, weight_max, alpha)
                errors[alpha] = w8a8_error(x, weight, reference, s)
            best = min(errors, key=lambda a: errors[a])
            choices[name] = Choice(maxima, best, errors)
        return hook

    hooked_forward(model, ids, lambda name: search(name, folds[part]) if (part := name.split(".", 2)[2]) in folds
                   else None)
    per_layer = []
    for i in range(len(model.layers)):
        picked = {fold: choices[f"layers.{i}.{linear}"].alpha for linear, fold in folds.items()}
        per_layer.append({fold: alpha for fold, alpha in picked.items() if alpha is not None})
    return {name: c.maxima for name, c in choices.items()}, per_layer, choices


def clip_ratios(x: torch.Tensor, weight: torch.Tensor, grid: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the clip ratio per output row of `weight`, each row's least error): for each c of `grid`, the row quantized
    with scale max|w| · c / 127 (quantize_rows' clip) times x quantized per row as the kernel does, against x w^T in
    fp32; the squared error summed over x's rows, per output row (rows are independent: each its own scale)."""
    reference = x @ weight.t()
    qx, dx = quantize_per_row(x)
    xq = qx.float() * dx[:, None]
    amax = weight.abs().amax(1)
    best = torch.ones(weight.shape[0])
    least = torch.full((weight.shape[0],), float("inf"))
    for c in grid:
        q, scale = quantize_rows(weight, (amax * c).clamp(min=torch.finfo(torch.float32).tiny) / 127)
        wq = q.float() * scale[:, None]
        err = (xq @ wq.t() - reference).square_().sum(0)
        better = err < least
        best[better], least[better] = c, err[better]
    return best, least


def search_clips(model: LlamaModel, ids: list[int], grid: Sequence[float], max_rows: int = CLIP_ROWS
                 ) -> dict[str, torch.Tensor]:
    """{linear name: weight scale per output row, max|w| · c / 127 (c: clip_ratios)} for every w8a8 linear (the
    layers' linears: the head stays int8 weight-only), each from clip_ratios on its input in one causal forward of
    `ids` (fp32, the smoothed model: the weights as they will be quantized), every k-th row of it, at most max_rows
    (0: all)."""
    clips: dict[str, torch.Tensor] = {}

    def search(name: str) -> Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], None]:
        def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            assert name not in clips, f"{name}: the calibration forward must see each linear once"
            x = args[0].detach().float().reshape(-1, args[0].shape[-1])
            if max_rows and x.shape[0] > max_rows:
                x = x[:: -(-x.shape[0] // max_rows)]
            assert isinstance(module, Linear)
            weight = module.weight.detach().float()
            clips[name] = weight.abs().amax(1) * clip_ratios(x, weight, grid)[0] / 127
        return hook

    hooked_forward(model, ids, search)
    return clips


def smooth_state(state: dict[str, torch.Tensor], model: LlamaModel, stats: dict[str, torch.Tensor],
                 alphas: dict[str, float] | Sequence[dict[str, float]]) -> None:
    """Folds the factors into `state` (fp32, Kev's names), in place: no second copy of the weights at load (the model
    `stats` were taken on may hold the same tensors; it is only read for its layer structure after this).
    alphas: {fold: α} (FOLDS), for every layer or one per layer (search_alphas)."""
    cfg = model.config
    dim, inter = cfg.head_dim, cfg.intermediate_size
    for i, layer in enumerate(model.layers):
        p = f"layers.{i}."
        chosen = alphas if isinstance(alphas, dict) else alphas[i]
        mlp_norm = "pre_feedforward_layernorm" if isinstance(layer, GemmaLayer) else "post_attention_layernorm"
        for fold, norm, linear in (("qkv", "input_layernorm", "self_attn.qkv_proj"),
                                   ("gate_up", mlp_norm, "mlp.gate_up_proj")):
            if fold not in chosen:
                continue
            weight = state[p + linear + ".weight"]
            s = _factor(stats[p + linear], weight.abs().amax(0), chosen[fold])
            state[p + norm + ".weight"].div_(s)
            weight.mul_(s)
        if "o" in chosen:  # one s per kv channel: v's rows divided, the o columns of every head in the group times it
            o_weight = state[p + "self_attn.o_proj.weight"]
            s = _o_factor(stats[p + "self_attn.o_proj"], o_weight, cfg.num_kv_heads, dim, chosen["o"])
            _divide_rows(state, p + "self_attn.qkv_proj", (cfg.num_heads + cfg.num_kv_heads) * dim, s)
            o_weight.mul_(_per_head(s, cfg.num_heads, cfg.num_kv_heads, dim))
        if "down" in chosen:  # down_proj's input is act(gate) · up: up's rows carry the division
            down = state[p + "mlp.down_proj.weight"]
            s = _factor(stats[p + "mlp.down_proj"], down.abs().amax(0), chosen["down"])
            _divide_rows(state, p + "mlp.gate_up_proj", inter, s)
            down.mul_(s)


def _divide_rows(state: dict[str, torch.Tensor], linear: str, start: int, s: torch.Tensor) -> None:
    """Rows start .. start + len(s) of the linear's weight (and bias) divided by s."""
    for suffix in (".weight", ".bias"):
        if linear + suffix not in state:
            continue
        part = state[linear + suffix][start: start + s.numel()]
        part /= s.view(-1, *([1] * (part.dim() - 1)))
