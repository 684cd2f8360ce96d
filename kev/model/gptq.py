"""GPTQ (Frantar et al., 2023) for w8a8's int8 weights: each weight row rounded to its int8 grid column by column,
every column's rounding error spread over the columns not yet rounded (weighted by the inverse of the calibration
input's Gram matrix H = X^T X), so the row's output error on the calibration activations, not each weight's own
error, is what is kept small. A weight transform at load: the grid (one scale per output row, max|w| / 127) and the
kernel are unchanged, only which integer each weight rounds to differs from round-to-nearest.

As llm-compressor's W8A8 recipe (SmoothQuant, then GPTQ per output channel), after the smoothing fold
(kev/model/smoothing.py). Sequential, as GPTQ's reference code runs it: one causal forward of the calibration text
through the smoothed fp32 model where each linear, when its input arrives, is quantized from that input (H over all
calibration rows) and then gives the w8a8 output (its input quantized per row as the kernel does, times the new int8
weight), so every later linear is calibrated on the inputs the quantized model will give it.

Kev's calibration text is short (1,109 tokens), so H is damped far more than the reference's 1% (DAMP: less damping
fits the calibration rows and loses on other text). The column loop runs on one thread (one_thread): ~10x faster
on busy cores, and its bits do not depend on the thread count (the default model's int8 file built at 1 and 2 threads
is the same bits). Its cost at load, once per model (cached): ~29 s of one core on the default model, +23 s wall
with 2 threads (bench/results/w8a8_quality.md).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from kev.model.calibration_forward import hooked_forward
from kev.model.linear import Linear
from kev.model.llama import LlamaModel
from kev.model.quant_weight import quantize_per_row
from kev.model.quantize import quantize_rows

BLOCK = 32  # columns updated together (the lazy batch of GPTQ's reference code; the same result in exact arithmetic)
# H's diagonal plus this fraction of its mean. GPTQ's reference code takes 0.01 with ~260k calibration tokens; Kev's
# calibration text is 1,109 tokens, fewer than down_proj's 1,536 inputs, and a small damping fits that text's own
# rows: summed over 28 of the default model's linears (every 5th layer), the w8a8 output error against round to
# nearest's was 0.64x on the calibration text at 0.03 but 0.98x on other text (README.md), and at 0.01 held-out
# perplexity got worse than round to nearest (1.0146x bf16 against 1.0117x). 1.0 was least on README.md (0.885x;
# 0.3: 0.896x, 3: 0.895x, 10: 0.917x), chosen there, never on the held-out text (bench/results/w8a8_quality.md).
DAMP = 1.0


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread inside: GPTQ's column loop is thousands of small ops, ~10x faster without intra-op
    threads' hand-offs (a [576, 1536] weight: 0.36 s against 3.9 s on 2 busy cores), and its bits then never depend
    on the thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def gptq_rows(weight: torch.Tensor, hessian: torch.Tensor, scale: torch.Tensor, damp: float = DAMP,
              block: int = BLOCK) -> torch.Tensor:
    """weight [out, K] rounded onto q · scale[:, None] (|q| <= 127) by GPTQ against hessian [K, K] (X^T X of the
    calibration input) plus damp · mean(diag H) on its diagonal, columns in order of decreasing H diagonal
    (act-order: the busiest channels first, while the most columns are left to take their error). Returns the
    dequantized grid values, fp32 [out, K]."""
    with one_thread():
        w = weight.double().clone()
        h = hessian.double().clone()
        dead = h.diagonal() == 0
        h[dead, dead] = 1.0
        w[:, dead] = 0.0
        order = torch.argsort(h.diagonal(), descending=True, stable=True)
        w, h = w[:, order], h[order][:, order]
        h.diagonal().add_(damp * float(h.diagonal().mean()))
        inverse = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True).float()
        w, s = w.float(), scale.float()[:, None]
        out = torch.zeros_like(w)
        columns = w.shape[1]
        for start in range(0, columns, block):
            end = min(start + block, columns)
            part, errors = w[:, start:end].clone(), torch.zeros_like(w[:, start:end])
            inv = inverse[start:end, start:end]
            for i in range(end - start):
                col = part[:, i: i + 1]
                q = torch.round(col / s).clamp_(-127, 127) * s
                out[:, start + i: start + i + 1] = q
                err = (col - q) / inv[i, i]
                part[:, i:] -= err * inv[i: i + 1, i:]
                errors[:, i: i + 1] = err
            w[:, end:] -= errors @ inverse[start:end, end:]
        return out[:, torch.argsort(order)].float()


def gptq_weights(model: LlamaModel, ids: list[int], sequential: bool = True, damp: float = DAMP
                 ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{linear name: (weight on its grid fp32, scale per output row)} for every w8a8 linear (the layers' linears; the
    head stays int8 weight-only, round to nearest), from one causal forward of `ids` through `model` (fp32, the
    smoothed weights); sequential: each linear then gives its w8a8 output to what follows (module docstring)."""
    done: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def quantize(name: str) -> Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], None]:
        def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            assert name not in done, f"{name}: the calibration forward must see each linear once"
            assert isinstance(module, Linear)
            x = args[0].detach().float().reshape(-1, args[0].shape[-1])
            weight = module.weight.detach().float()
            scale = quantize_rows(weight)[1]  # the kernel's grid: max|w| / 127 per output row
            done[name] = gptq_rows(weight, x.t().double() @ x.double(), scale, damp), scale
        return hook

    def w8a8_output(name: str) -> Callable[[torch.nn.Module, tuple[torch.Tensor, ...], torch.Tensor], torch.Tensor]:
        def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
            x = args[0].detach().float().reshape(-1, args[0].shape[-1])
            qx, dx = quantize_per_row(x)
            out = (qx.float() @ done[name][0].t()) * dx[:, None]
            assert isinstance(module, Linear)
            if module.bias is not None:
                out += module.bias.float()
            return out.to(output.dtype).view_as(output)
        return hook

    hooked_forward(model, ids, quantize, w8a8_output if sequential else None)
    return done
