"""One causal forward of a calibration text through a model, outside the engine: what w8a8's load-time calibration
(SmoothQuant's activation maxima, kev/model/smoothing.py; GPTQ's Hessians, kev/model/gptq.py) hooks its linears on."""
from __future__ import annotations

import torch

from kev.model.attention import PagedKVLayer
from kev.model.llama import LlamaModel
from kev.model.step_metadata import ChannelSpan, StepMetadata


def prompt_logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """One causal forward of `ids` as one question's whole prompt in one step: the last row's logits [1, vocab]."""
    rows = torch.arange(len(ids))
    span = ChannelSpan(0, 0, len(ids), len(ids), rows, None, True)
    meta = StepMetadata(torch.tensor(ids), rows, [len(ids)], rows, rows, [span], rows[-1:], [1])
    cfg = model.config
    caches = [PagedKVLayer(len(ids), cfg.num_kv_heads, cfg.head_dim, model.dtype, model.device) for _ in model.layers]
    with torch.no_grad():
        return model.forward(meta, caches)
