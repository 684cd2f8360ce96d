"""The flash-style prefill kernel (cpu_kernels/prefill_attention.cpp): a query row's bits depend only on its own
channel's keys, never on how its prompt was chunked or which other chunks share the call; and it is attention."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from kev.model.cpu_kernels import load_cpu_kernels
from kev.model.model_store import cache_root

LENGTHS = [1, 2, 31, 32, 33, 97, 512, 1000, 2049, 4096]  # a sample of 1..4,096, tile edges included
CHUNKS = [17, 128, 2048]


@pytest.fixture(scope="module", autouse=True)
def prefill_kernel() -> None:
    assert load_cpu_kernels(cache_root()), "Kev's C++ kernels did not build (see the warning above)"
    if not torch.ops.kev.prefill_attention_supported():
        pytest.skip("this CPU has no AVX-512 BF16: prompt rows take the row kernel")


def make_case(heads: int, kv_heads: int, dim: int, lengths: list[int], seed: int):
    gen = torch.Generator().manual_seed(seed)
    num_slots = sum(lengths) + 64
    kv = torch.randn(2, num_slots, kv_heads, dim, generator=gen).to(torch.bfloat16)
    order = torch.randperm(num_slots, generator=gen)  # scattered slots, as pages are
    slots, start = [], 0
    for length in lengths:
        slots.append(order[start:start + length].contiguous())
        start += length
    queries = [torch.randn(length, heads, dim, generator=gen).to(torch.bfloat16) for length in lengths]
    return kv, slots, queries


def attend(kv: torch.Tensor, chunks: list[tuple[torch.Tensor, torch.Tensor, int]]) -> list[torch.Tensor]:
    """One kernel call over several chunks: (queries of the chunk, the context's slots, first position)."""
    q = torch.cat([c[0] for c in chunks])
    spans, row, offset = [], 0, 0
    for queries, _slots, first in chunks:
        spans.append([row, len(queries), first + len(queries), offset])
        row, offset = row + len(queries), offset + first + len(queries)
    out = torch.empty_like(q)
    slot_list = torch.cat([c[1][:c[2] + len(c[0])] for c in chunks])
    torch.ops.kev.prefill_attention(q, kv, out, torch.tensor(spans), slot_list, q.shape[-1] ** -0.5)
    return list(out.split([len(c[0]) for c in chunks]))


def chunked(kv: torch.Tensor, queries: torch.Tensor, slots: torch.Tensor, chunk: int) -> torch.Tensor:
    return torch.cat([attend(kv, [(queries[s:s + chunk], slots, s)])[0] for s in range(0, len(queries), chunk)])


@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (8, 2, 128)], ids=["135m", "dim128"])
def test_a_rows_bits_do_not_depend_on_chunking_or_neighbours(heads, kv_heads, dim):
    lengths = LENGTHS if dim == 64 else [1, 33, 700]
    kv, slots, queries = make_case(heads, kv_heads, dim, lengths, seed=dim)
    whole = [attend(kv, [(q, s, 0)])[0] for q, s in zip(queries, slots)]
    for index, (q, s) in enumerate(zip(queries, slots)):
        for chunk in CHUNKS:
            if chunk < len(q):
                assert torch.equal(chunked(kv, q, s, chunk), whole[index]), (len(q), chunk)
    rng = random.Random(0)
    for _ in range(3):  # several channels' chunks in one call, in any order, at any offset
        picked = rng.sample(range(len(lengths)), k=min(4, len(lengths)))
        parts = []
        for i in picked:
            first = rng.randrange(len(queries[i]))
            parts.append((queries[i][first:], slots[i], first))
        for i, (part, out) in zip(picked, zip(parts, attend(kv, parts))):
            assert torch.equal(out, whole[i][part[2]:]), (lengths[i], part[2])


def test_it_is_causal_attention_over_the_channels_own_keys():
    kv, slots, queries = make_case(9, 3, 64, [1, 45, 300], seed=3)
    for q, s in zip(queries, slots):
        out = attend(kv, [(q, s, 0)])[0].float()
        keys_values = kv[:, s].float().transpose(1, 2)[:, None]  # [2, 1, kv_heads, ctx, dim]
        exact = F.scaled_dot_product_attention(q.float().transpose(0, 1)[None], keys_values[0], keys_values[1],
                                               is_causal=True, enable_gqa=True)[0].transpose(0, 1)
        # bf16 output (relative 2^-8) and bf16 probabilities in the value products
        assert (out - exact).abs().max() < 2e-2, len(q)
