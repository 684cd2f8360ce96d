"""w8a8's head in two passes for the rows read for their argmax alone: every logit from int8 activations, then the
exact head wherever it could be the row's maximum.

The head is a quarter of the default model's multiply-adds, and int8 activations there alone cost perplexity (the
logits are what sampling reads), so w8a8 keeps it int8 weight-only (kev/model/quantize.py): bf16 activations on
`vdpbf16ps`, half the rate of the int8 `vpdpbusd`. Here the first pass runs the same int8 weights on the w8a8 kernel
with the head input's outlier channels (chosen once on the calibration text) quantized apart from the rest
(cpu_kernels/w8a8_gemm.cpp's split), which keeps its error small; the second pass (cpu_kernels/head_rescore.cpp)
bounds that error per logit and recomputes, with the plain head's own arithmetic, every block of 16 logits that could
hold the row's maximum: a few dozen of 3,072 blocks. A row's maximum and its argmax are then the plain head's bit for
bit. The model serves only the rows whose sampling reads nothing else with it (StepMetadata.argmax_only: greedy, no
grammar, logit_bias, penalties or logprobs) and the plain head serves the rest, so every token, logprob and
distribution a caller sees is the plain head's. Every step is per row: batched rows stay bit-identical to solo.
"""
from __future__ import annotations

import torch

from kev.model.calibration_forward import head_inputs
from kev.model.linear import GemmWeight
from kev.model.llama import LlamaModel
from kev.model.quant_format import W8_TILE_K
from kev.model.quant_weight import pack_w8a8, w8a8_paths

# Relative fp32 rounding of either pass against ‖x‖₂ · s_v · ‖q_v‖₂: the head's 288 vdpbf16ps steps round twice each
# (2 · 288 · 2⁻²⁴ = 3.4e-5), the first pass's fp32 steps a few times (kernels above: the bound's derivation).
ROUNDING = 4e-5
_PATH_VNNI = 1  # w8a8_gemm.cpp's Path: the split runs on AVX-512 VNNI (and plain C++, for tests)


class RescoredHead:
    """The head's two passes over one int8 GemmWeight; `first` are the channels the first pass quantizes apart."""

    def __init__(self, gemm: GemmWeight, first: torch.Tensor) -> None:
        q = gemm.unpack()  # int8 [vocab, hidden]
        k = q.shape[1]
        assert gemm.scale is not None and first.numel() == W8_TILE_K < k
        rest = torch.ones(k, dtype=torch.bool)
        rest[first] = False
        self.order = torch.cat([first, rest.nonzero().squeeze(1)])  # the first pass's column order
        scale = gemm.scale[: gemm.out_features]
        self.first_pass = pack_w8a8(q[:, self.order], scale)
        magnitude = q.float().abs()
        # per logit, then each block of 16 logits' largest (the second pass's first scans take a block's margin)
        self.element_bounds = torch.stack([scale * magnitude[:, first].sum(1), scale * magnitude[:, rest].sum(1)])
        pad = -self.element_bounds.shape[1] % 16
        self.bounds = torch.nn.functional.pad(self.element_bounds, (0, pad)).view(2, -1, 16).amax(2).contiguous()
        self.gemm = gemm
        self.rescored_blocks = 0  # blocks the second pass recomputed, all calls (what the tests read)

    @staticmethod
    def applies_to(packed: object) -> bool:
        """An int8 head on Kev's AVX-512 GEMM, and the w8a8 kernel's VNNI path present (the split runs there)."""
        return (isinstance(packed, GemmWeight) and packed.dtype == torch.int8 and not packed.k_major
                and "avx512-vnni" in w8a8_paths() and packed.in_features > W8_TILE_K)

    def tensors(self) -> list[torch.Tensor]:
        """What it holds besides the plain head: the first pass's weights and scales, the bounds."""
        return [*self.first_pass.tensors(), self.bounds, self.element_bounds]

    def __call__(self, x: torch.Tensor, path: int = _PATH_VNNI) -> torch.Tensor:
        """fp32 logits [rows, vocab] of bf16 rows x (path: the first pass's, 2 = plain C++ for tests)."""
        x = x.contiguous()
        grouped = x.index_select(1, self.order)
        w = self.first_pass
        logits = torch.ops.kev.w8a8_linear(grouped, w.cells, w.scale, None, w.out_features, path, False, 1)
        self.rescored_blocks += torch.ops.kev.head_rescore_(logits, x, grouped, W8_TILE_K, self.gemm.packed,
                                                            self.gemm.scale, self.bounds, self.element_bounds,
                                                            ROUNDING)
        return logits


def two_pass_head(model: LlamaModel) -> RescoredHead | None:
    """The model's two-pass head where it applies (a w8a8 model, which keeps its calibration tokens, prepacked on Kev's
    kernels); the one built already for the same packed head is kept. The first pass's outlier channels: the head
    input's W8_TILE_K channels of largest |x| over one forward of the calibration text (the plain head not run)."""
    head = model.head
    if model.calibration_ids is None or not RescoredHead.applies_to(head.packed):
        return None
    built = model.rescored_head
    if isinstance(built, RescoredHead) and built.gemm is head.packed:
        return built
    assert isinstance(head.packed, GemmWeight)
    # no further than the positions the model holds (core.max_context): past its rotary table a row is no hidden state
    hidden = head_inputs(model, model.calibration_ids[: model.max_positions])
    first = hidden.float().abs().amax(0).topk(W8_TILE_K).indices.sort().values
    return RescoredHead(head.packed, first)
