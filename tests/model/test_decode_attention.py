"""Decode attention is batched per padded key length: a channel's output bits must not depend on
which other channels share its call, and its keys must be its own."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from kev.model.attention import PagedKVLayer, paged_attention
from kev.model.step_metadata import KEY_BUCKET, ChannelSpan, StepMetadata

HEADS, KV_HEADS, DIM, SLOTS = 9, 3, 64, 4096
CONTEXTS = [1, 5, 37, 63, 64, 65, 90, 127, 128, 129, 200, 333]


def decode_step(contexts: list[int], slots: dict[int, torch.Tensor]) -> StepMetadata:
    """One decode row per channel (channel id = its index in contexts), in the given order."""
    spans = [ChannelSpan(channel, row, 1, contexts[channel], slots[channel], None, False)
             for row, channel in enumerate(slots)]
    rows = torch.arange(len(spans))
    last_slot = torch.stack([span.kv_slots[-1] for span in spans])
    return StepMetadata(rows, rows, [len(spans)], rows, last_slot, spans, rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_channels_decode_attention_is_the_same_alone_and_packed(dtype):
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
        out = paged_attention(q, k, v, cache, meta)
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


def test_decode_groups_pad_with_the_channels_own_slots():
    slots = {c: torch.arange(1000 * c, 1000 * c + ctx) for c, ctx in enumerate(CONTEXTS)}
    meta = decode_step(CONTEXTS, slots)
    assert sum(group.rows.numel() for group in meta.decode_groups) == len(CONTEXTS)
    for group in meta.decode_groups:
        assert group.padded_len % KEY_BUCKET == 0
        for i, row in enumerate(group.rows.tolist()):
            span = meta.spans[row]
            keys = group.kv_slots[i * group.padded_len:(i + 1) * group.padded_len]
            assert set(keys.tolist()) <= set(span.kv_slots.tolist())
            assert group.key_mask[i].sum() == span.ctx_len
            assert torch.equal(keys[: span.ctx_len], span.kv_slots)
            assert span.ctx_len <= group.padded_len < span.ctx_len + KEY_BUCKET
