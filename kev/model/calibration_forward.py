"""One causal forward of a calibration text through a model, outside the engine: what w8a8's load-time calibration
(SmoothQuant's activation maxima, kev/model/smoothing.py; GPTQ's Hessians, kev/model/gptq.py) hooks its linears on."""
from __future__ import annotations

from collections.abc import Callable

import torch

from kev.model.attention import PagedKVLayer
from kev.model.linear import Linear
from kev.model.llama import LlamaModel
from kev.model.step_metadata import ChannelSpan, StepMetadata


def prompt_logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """One causal forward of `ids` as one question's whole prompt in one step: the last row's logits [1, vocab]."""
    meta, caches = _one_prompt(model, ids, every_row=False)
    with torch.no_grad():
        return model.forward(meta, caches)


def head_inputs(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """The same forward, stopping before the head: every position's head input [len(ids), hidden]."""
    meta, caches = _one_prompt(model, ids, every_row=True)
    with torch.no_grad():
        return model.final_hidden(meta, caches)


def _one_prompt(model: LlamaModel, ids: list[int], every_row: bool) -> tuple[StepMetadata, list[PagedKVLayer]]:
    rows = torch.arange(len(ids))
    span = ChannelSpan(0, 0, len(ids), len(ids), rows, None, True)
    sampled = rows if every_row else rows[-1:]
    meta = StepMetadata(torch.tensor(ids), rows, [len(ids)], rows, rows, [span], sampled, [sampled.numel()])
    cfg = model.config
    caches = [PagedKVLayer(len(ids), cfg.num_kv_heads, cfg.head_dim, model.dtype, model.device) for _ in model.layers]
    return meta, caches


PreHook = Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], None]
PostHook = Callable[[torch.nn.Module, tuple[torch.Tensor, ...], torch.Tensor], torch.Tensor]


def hooked_forward(model: LlamaModel, ids: list[int], before: Callable[[str], PreHook | None],
                   after: Callable[[str], PostHook] | None = None) -> None:
    """prompt_logits with before(name) as a forward pre-hook on each of the layers' linears (None: none on that one)
    and after(name), where given, as its forward hook (which may replace its output); the hooks go when it ends."""
    handles = []
    for name, module in model.named_modules():
        if not (isinstance(module, Linear) and name.startswith("layers.")):
            continue
        pre = before(name)
        if pre is not None:
            handles.append(module.register_forward_pre_hook(pre))
        if after is not None:
            handles.append(module.register_forward_hook(after(name)))
    try:
        prompt_logits(model, ids)
    finally:
        for handle in handles:
            handle.remove()
