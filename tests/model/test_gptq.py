"""GPTQ for w8a8's int8 weights (kev/model/gptq.py): every weight lands on its row's int8 grid (the scale unchanged,
so the kernel reads it as any other), the output error is below round to nearest's on the calibration input and on
fresh input from the same source (the damping: fewer calibration rows than inputs, as down_proj's on the default
model), the result has the same bits every time and at any thread count, on a model every layer linear is covered
and the head never, and the cache key names it."""
from __future__ import annotations

from pathlib import Path

import torch

import kev.model.smoothing as smoothing
from kev.model.gptq import DAMP, gptq_rows, gptq_weights
from kev.model.quantize import cache_path, quantize_rows, quantize_state
from kev.model.smoothing import Smoothing, default_smoothing
from tests.model.test_smoothing import IDS, SHAPE, outlier_model


def correlated_input(rows: int, k: int, seed: int, mix_seed: int = 4) -> torch.Tensor:
    """Calibration-like activations: correlated channels (the same mix for every seed) and a few large ones."""
    mix = torch.eye(k) + 0.3 * torch.randn(k, k, generator=torch.Generator().manual_seed(mix_seed))
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed)) @ mix
    x[:, [2, 11]] *= 10.0
    return x


def output_error(x: torch.Tensor, w: torch.Tensor, wq: torch.Tensor) -> float:
    return float((x @ (wq - w).t()).square().sum())


def test_gptq_stays_on_the_grid_and_beats_round_to_nearest():
    g = torch.Generator().manual_seed(5)
    x = correlated_input(400, 96, 4)
    w = torch.randn(40, 96, generator=g) * 0.05
    q, scale = quantize_rows(w)
    rtn = q.float() * scale[:, None]
    for damp in (0.01, DAMP):
        out = gptq_rows(w, x.t().double() @ x.double(), scale, damp)
        steps = out / scale[:, None]
        torch.testing.assert_close(steps, steps.round(), rtol=0, atol=1e-4)
        assert steps.round().abs().max() <= 127
        requantized, same_scale = quantize_rows(out, scale)  # what quantize_state stores: the GPTQ integers exactly
        torch.testing.assert_close(requantized.float() * same_scale[:, None], out, rtol=0, atol=0)
        assert output_error(x, w, out) < 0.8 * output_error(x, w, rtn), damp


def test_the_damping_keeps_the_gain_on_input_gptq_never_saw():
    """Fewer calibration rows (200) than inputs (256), as down_proj's on the default model: GPTQ at DAMP is below
    round to nearest on 4,000 fresh rows of the same source as well as on its own rows; with almost no damping it
    fits its own rows further but loses more of the gain on fresh ones."""
    g = torch.Generator().manual_seed(7)
    w = torch.randn(64, 256, generator=g) * 0.05
    fit, fresh = correlated_input(200, 256, 1), correlated_input(4000, 256, 2)
    q, scale = quantize_rows(w)
    rtn = q.float() * scale[:, None]
    h = fit.t().double() @ fit.double()
    damped, loose = gptq_rows(w, h, scale, DAMP), gptq_rows(w, h, scale, 1e-4)
    ratio = lambda x, wq: output_error(x, w, wq) / output_error(x, w, rtn)  # noqa: E731
    assert ratio(fit, damped) < 0.8 and ratio(fresh, damped) < 0.9
    assert ratio(fit, loose) < ratio(fit, damped) and ratio(fresh, loose) > ratio(fresh, damped)


def test_gptq_has_the_same_bits_every_time_and_at_any_thread_count():
    threads = torch.get_num_threads()
    runs = []
    try:
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            runs.append(gptq_weights(outlier_model(), IDS))
    finally:
        torch.set_num_threads(threads)
    for other in runs[1:]:
        assert other.keys() == runs[0].keys()
        for name, (weight, scale) in runs[0].items():
            assert torch.equal(other[name][0], weight) and torch.equal(other[name][1], scale), name


def test_gptq_covers_every_layer_linear_and_quantize_state_keeps_its_integers():
    model = outlier_model()
    done = gptq_weights(model, IDS)
    layer_linears = {name for name, m in model.named_modules() if name.startswith("layers.") and hasattr(m, "scale")}
    assert set(done) == layer_linears
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rtn_differs = False
    for name, (weight, _) in done.items():
        q, scale = quantize_rows(state[name + ".weight"])
        rtn_differs |= not torch.equal(q.float() * scale[:, None], weight)
        state[name + ".weight"] = weight
    assert rtn_differs  # GPTQ chose other integers than round to nearest somewhere
    out = quantize_state(state, model, {name: scale for name, (_, scale) in done.items()})
    for name, (weight, scale) in done.items():
        assert torch.equal(out[name + ".scale"], scale)
        torch.testing.assert_close(out[name + ".weight"].float() * scale[:, None], weight, rtol=0, atol=0)
    head_q, head_scale = quantize_rows(state["embed_tokens.weight"])  # the head: round to nearest, max|w| / 127
    assert torch.equal(out["embed_tokens.weight"], head_q) and torch.equal(out["embed_tokens.scale"], head_scale)
    assert SHAPE.num_layers == 2


def test_the_cache_key_names_gptq_and_its_damping(tmp_path: Path):
    smoothing_now = default_smoothing()
    assert smoothing_now is not None and smoothing_now.gptq == DAMP and f"gptq{DAMP:g}" in smoothing_now.tag
    folder = tmp_path / "model"
    folder.mkdir()
    tags = {Smoothing((), "text").tag, Smoothing((), "text", gptq=DAMP).tag, Smoothing((), "text", gptq=0.01).tag}
    assert len(tags) == 3
    assert len({cache_path(folder, tmp_path, tag) for tag in tags}) == 3
    was = smoothing.GPTQ
    try:
        smoothing.GPTQ = None
        rounded = default_smoothing()
    finally:
        smoothing.GPTQ = was
    assert rounded is not None and rounded.gptq is None and "gptq" not in rounded.tag
    assert rounded.tag != smoothing_now.tag
