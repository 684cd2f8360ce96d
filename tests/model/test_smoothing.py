"""w8a8's SmoothQuant fold (kev/model/smoothing.py): exact in real arithmetic (an fp32 model gives the same logits
before and after, to fp32 rounding), it flattens the activations it targets, and it names itself in the int8 cache
key and the numerics fingerprint."""
from __future__ import annotations

from pathlib import Path

import torch

from kev.model.families import model_class
from kev.model.model_config import ModelConfig
from kev.model.quantize import cache_path
from kev.model.calibration_forward import prompt_logits
from kev.model.smoothing import (FOLDS, GRID, Smoothing, _factor, activation_maxima, clip_ratios, default_smoothing,
                                search_alphas, smooth_state, w8a8_error)
from kev.model.weights import random_model

# GQA (2 heads per kv head) and q/k/v biases: the v-into-o fold's grouping and v's bias are exercised.
SHAPE = ModelConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=16, attention_bias=True)
IDS = [(7 * i + 3) % 96 for i in range(40)]


def outlier_model():
    """Random weights with a few input channels ~30x the others after each norm (what real models show)."""
    model = random_model(SHAPE, "fp32", torch.device("cpu"), max_positions=64, seed=1)
    for name, param in model.named_parameters():
        if name.endswith("layernorm.weight"):
            param.data[[3, 17, 40]] = 30.0
    return model


def test_smoothing_keeps_the_logits_and_flattens_the_activations():
    model = outlier_model()
    before = prompt_logits(model, IDS)
    stats = activation_maxima(model, IDS)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    smooth_state(state, model, stats, {fold: 0.5 for fold in FOLDS})
    name = "layers.0.self_attn.qkv_proj.weight"
    assert not torch.equal(state[name], model.state_dict()[name])
    smoothed = model_class(SHAPE)(SHAPE, 64)
    smoothed.load_state_dict(state, strict=True)
    after = prompt_logits(smoothed, IDS)
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)
    flat = activation_maxima(smoothed, IDS)
    for name in ("layers.0.self_attn.qkv_proj", "layers.1.mlp.gate_up_proj"):
        spread = lambda m: float(m.max() / m.median())  # noqa: E731
        assert spread(flat[name]) < spread(stats[name]) / 2, name


def test_the_cache_key_and_fingerprint_name_the_smoothing(tmp_path: Path):
    smoothing = default_smoothing()
    assert smoothing is not None
    folder = tmp_path / "model"
    folder.mkdir()
    plain, smoothed = cache_path(folder, tmp_path), cache_path(folder, tmp_path, smoothing.tag)
    assert plain != smoothed and smoothing.tag in smoothed.name
    assert smoothing.tag.startswith("sq")
    auto, fixed = Smoothing((), "text", GRID), Smoothing((("qkv", 0.5),), "text")
    assert "auto" in auto.tag and auto.tag != fixed.tag != Smoothing((), "text", GRID[:-1]).tag
    assert Smoothing((), "text", GRID, 128).tag != auto.tag
    assert Smoothing((), "other text", GRID).tag != auto.tag


def test_the_search_beats_a_fixed_alpha_on_an_outlier_channel_and_the_fold_stays_exact():
    """A linear whose input has two channels ~40x the others: the α searched is one whose w8a8 error is no larger
    than the fixed α's (0.5) nor than no smoothing's, and X / s times W · s is X W^T (fp64)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(200, 64, generator=g, dtype=torch.float64)
    x[:, [5, 30]] *= 40.0
    w = torch.randn(48, 64, generator=g, dtype=torch.float64) * 0.05
    maxima, wmax = x.abs().amax(0), w.abs().amax(0)
    reference = (x @ w.t()).float()
    errors = {alpha: w8a8_error(x.float(), w.float(), reference, _factor(maxima, wmax, alpha).float())
              for alpha in GRID}
    errors[None] = w8a8_error(x.float(), w.float(), reference, None)
    best = min(errors, key=lambda a: errors[a])
    assert errors[best] <= errors[0.5] and errors[best] < errors[None] / 4
    s = _factor(maxima, wmax, best)
    torch.testing.assert_close((x / s) @ (w * s).t(), x @ w.t(), rtol=1e-12, atol=1e-12)


def test_the_searched_alphas_keep_the_logits():
    """search_alphas on the outlier model: an α per layer and fold from the grid (or none), folded per layer by
    smooth_state, and the fp32 logits stay what they were; every searched α's error is the least it measured."""
    model = outlier_model()
    before = prompt_logits(model, IDS)
    stats, per_layer, choices = search_alphas(model, IDS, GRID)
    assert len(per_layer) == SHAPE.num_layers and any(per_layer)
    assert all(set(d) <= set(FOLDS) and all(a in GRID for a in d.values()) for d in per_layer)
    for choice in choices.values():
        assert choice.errors[choice.alpha] == min(choice.errors.values())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    smooth_state(state, model, stats, per_layer)
    smoothed = model_class(SHAPE)(SHAPE, 64)
    smoothed.load_state_dict(state, strict=True)
    torch.testing.assert_close(prompt_logits(smoothed, IDS), before, rtol=1e-4, atol=1e-4)


def test_the_clip_search_is_never_worse_than_no_clip_and_names_itself():
    """Heavy-tailed weight rows: clip_ratios' pick per row is from the grid, its error no larger than c = 1's
    (max|w| / 127, quantize_rows' scale) and below it summed, with some row clipped; the clip grid changes the tag."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(300, 512, generator=g)
    w = torch.randn(32, 512, generator=g) * 0.05 * torch.randn(32, 512, generator=g).abs() ** 2
    grid = tuple(round(1 - 0.02 * i, 2) for i in range(16))
    best, least = clip_ratios(x, w, grid)
    _, unclipped = clip_ratios(x, w, (1.0,))
    assert all(min(abs(b - c) for c in grid) < 1e-6 for b in best.tolist()) and bool((best < 1).any())
    assert bool((least <= unclipped).all()) and float(least.sum()) < float(unclipped.sum())
    clipped = Smoothing((), "text", clip=grid, clip_rows=256).tag
    assert clipped != Smoothing((), "text").tag != Smoothing((), "text", clip=grid[:-1], clip_rows=256).tag != clipped
