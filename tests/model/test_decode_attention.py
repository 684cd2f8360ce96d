"""Decode attention (the C++ kernel, or SDPA batched per padded key length): a channel's output bits
must not depend on which other channels share its call, and its keys must be its own."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from kev.model.attention import PagedKVLayer, paged_attention
from kev.model.cpu_kernels import load_cpu_kernels
from kev.model.model_store import cache_root
from kev.model.step_metadata import ChannelSpan, StepMetadata

HEADS, KV_HEADS, DIM, SLOTS = 9, 3, 64, 4096
CONTEXTS = [1, 5, 37, 63, 64, 65, 90, 127, 128, 129, 200, 333]


def decode_step(contexts: list[int], slots: dict[int, torch.Tensor]) -> StepMetadata:
    """One decode row per channel (channel id = its index in contexts), in the given order."""
    spans = [ChannelSpan(channel, row, 1, contexts[channel], slots[channel], None, False)
             for row, channel in enumerate(slots)]
    rows = torch.arange(len(spans))
    last_slot = torch.stack([span.kv_slots[-1] for span in spans])
    return StepMetadata(rows, rows, [len(spans)], rows, last_slot, spans, rows, [len(spans)])


@pytest.fixture(scope="module")
def kernel_built(tmp_path_factory) -> bool:
    return load_cpu_kernels(cache_root())


@pytest.mark.parametrize("decode_kernel", [False, True], ids=["sdpa", "kev-kernel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_channels_decode_attention_is_the_same_alone_and_packed(dtype, decode_kernel, kernel_built):
    assert kernel_built or not decode_kernel, "the C++ decode kernel did not build (see the warning above)"
    gen = torch.Generator().manual_seed(0)
    cache = PagedKVLayer(SLOTS, KV_HEADS, DIM, dtype, torch.device("cpu"))
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=gen))
    slot_order = torch.randperm(SLOTS, generator=gen)  # scattered slots, as pages are
    slots, start = {}, 0
    for channel, ctx in enumerate(CONTEXTS):
        slots[channel] = slot_order[start:start + ctx]
        start += ctx
    queries = {c: torch.randn(1, HEADS, DIM, generator=gen).to(dtype) for c in slots}
    new_kv = {c: cache.kv[:, slots[c][-1]].clone() for c in slots}  # rewrite the last key with itself

    def run(order: list[int]) -> dict[int, torch.Tensor]:
        meta = decode_step(CONTEXTS, {c: slots[c] for c in order})
        q = torch.cat([queries[c] for c in order])
        k = torch.stack([new_kv[c][0] for c in order])
        v = torch.stack([new_kv[c][1] for c in order])
        out = paged_attention(q, k, v, cache, meta, decode_kernel)
        return {c: out[row] for row, c in enumerate(order)}

    alone = {c: run([c])[c] for c in slots}
    rng = random.Random(1)
    for _ in range(3):
        order = list(slots)
        rng.shuffle(order)
        packed = run(order[: rng.randint(2, len(order))])
        for channel, out in packed.items():
            assert torch.equal(out, alone[channel]), (dtype, channel, CONTEXTS[channel])
    # and it is attention over exactly the channel's own keys (padding masked out)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for channel, out in alone.items():
        keys_values = cache.kv[:, slots[channel]].transpose(1, 2)[:, None]
        exact = F.scaled_dot_product_attention(queries[channel].transpose(0, 1)[None], keys_values[0], keys_values[1],
                                               enable_gqa=True)[0, :, 0]
        assert (out.float() - exact.float()).abs().max() < tolerance


@pytest.mark.parametrize("heads,kv_heads,dim", [(8, 8, 128), (8, 4, 128), (16, 2, 64), (4, 1, 192), (6, 2, 48)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_kernel_is_attention_at_every_group_and_head_size(heads, kv_heads, dim, dtype, kernel_built):
    """Each vector path (AVX-512 register tiles, AVX2 8-key tiles, the scalar loop) against SDPA, at context lengths
    around its tile edges."""
    assert kernel_built
    for ctx in (1, 7, 8, 9, 70, 301):
        gen = torch.Generator().manual_seed(ctx)
        cache = PagedKVLayer(1024, kv_heads, dim, dtype, torch.device("cpu"))
        cache.kv.copy_(torch.randn(cache.kv.shape, generator=gen))
        slots = torch.randperm(1024, generator=gen)[:ctx]
        q = torch.randn(1, heads, dim, generator=gen).to(dtype)
        rows = torch.arange(1)
        meta = StepMetadata(rows, rows, [1], rows, slots[-1:], [ChannelSpan(0, 0, 1, ctx, slots, None, False)], rows,
                            [1])
        out = paged_attention(q, cache.kv[0, slots[-1:]].clone(), cache.kv[1, slots[-1:]].clone(), cache, meta, True)
        keys_values = cache.kv[:, slots].transpose(1, 2)[:, None].float()
        exact = F.scaled_dot_product_attention(q.float().transpose(0, 1)[None], keys_values[0], keys_values[1],
                                               enable_gqa=True)[0, :, 0]
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2
        assert (out.float() - exact).abs().max() < tolerance, (ctx, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prompt_rows_bits_do_not_depend_on_the_rows_sharing_its_call(dtype, kernel_built):
    """A prompt chunk's rows share their channel's keys (and, on AVX2, one task per 8 rows): each row's output must
    be what it is alone and whatever the chunking, at lengths on and off the 8-key tiles and 64-key value passes."""
    assert kernel_built
    gen = torch.Generator().manual_seed(5)
    cache = PagedKVLayer(SLOTS, KV_HEADS, DIM, dtype, torch.device("cpu"))
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=gen))
    context = 203
    slots = torch.randperm(SLOTS, generator=gen)[:context]
    q = torch.randn(context, HEADS, DIM, generator=gen).to(dtype)

    def attend(positions: list[int]) -> torch.Tensor:
        """Rows at these positions (causal: position p sees p + 1 keys), all in one call."""
        out = torch.zeros(context, HEADS, DIM, dtype=dtype)
        rows = torch.tensor(positions)
        torch.ops.kev.paged_attention(q, cache.kv, out, rows, slots, torch.zeros_like(rows), rows + 1, DIM ** -0.5)
        return out

    whole = attend(list(range(context)))
    for chunk in ([list(range(0, 70)), list(range(70, 129)), list(range(129, context))],
                  [list(range(p, min(p + 13, context))) for p in range(0, context, 13)]):
        for positions in chunk:
            part = attend(positions)
            assert torch.equal(part[positions], whole[positions]), (positions[0], dtype)
    for position in (0, 7, 8, 63, 64, 65, 130, context - 1):
        assert torch.equal(attend([position])[position], whole[position]), (position, dtype)
