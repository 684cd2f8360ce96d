"""Every Triton kernel against its torch reference (fp32, the interpreter), and batched == solo bit for bit: a row's
result never depends on the rows beside it, their number, or its place among them."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kev.model.triton import reference
from tests.model.triton.conftest import KERNEL_DEVICE, needs_triton

needs_triton(KERNEL_DEVICE)

from kev.model.triton import attention_kernel, gemm_kernel, rotary_kernel, row_kernels  # noqa: E402

gen = torch.Generator().manual_seed(0)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(KERNEL_DEVICE)


def tensor(values: list) -> torch.Tensor:
    return torch.tensor(values, device=KERNEL_DEVICE)


def each_row_alone_equals(batched: torch.Tensor, run_rows) -> None:
    """run_rows(index tensor) -> the kernel over just those rows; every row alone, and the rows reversed."""
    for row in range(batched.shape[0]):
        assert torch.equal(run_rows(tensor([row])), batched[row: row + 1]), f"row {row} alone differs"
    order = torch.arange(batched.shape[0], device=KERNEL_DEVICE).flip(0)
    assert torch.equal(run_rows(order), batched[order]), "rows in another order differ"


def test_add_rms_norm_matches_reference_and_is_row_invariant():
    x, pending, weight = randn(5, 48), randn(5, 48), randn(48)  # 48: not a power of two, the block is masked
    stream, stream_ref = x.clone(), x.clone()
    out = row_kernels.add_rms_norm(stream, pending, weight, 1e-5)
    expected = reference.add_rms_norm(stream_ref, pending, weight, 1e-5)
    assert torch.equal(stream, stream_ref)  # the residual add, in place
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(row_kernels.add_rms_norm(x.clone(), None, weight, 1e-5),
                               reference.add_rms_norm(x.clone(), None, weight, 1e-5), rtol=1e-5, atol=1e-5)
    each_row_alone_equals(out, lambda rows: row_kernels.add_rms_norm(x[rows].clone(), pending[rows], weight, 1e-5))


@pytest.mark.parametrize("gelu", [False, True], ids=["silu", "geglu"])
def test_gated_activation_matches_reference_and_is_row_invariant(gelu):
    gate_up = randn(4, 2 * 1100) * 3  # wider than one column block
    out = row_kernels.gated(gate_up, gelu)
    torch.testing.assert_close(out, reference.gated(gate_up, gelu), rtol=1e-5, atol=1e-5)
    each_row_alone_equals(out, lambda rows: row_kernels.gated(gate_up[rows].contiguous(), gelu))


def test_argmax_is_torch_argmax_first_maximum_wins():
    logits = randn(4, 9000)
    logits[1, 17] = logits[1, 8500] = 50.0  # a tie across scan blocks: the first one
    logits[2, 4096] = logits[2, 4097] = 60.0  # a tie inside one block
    assert torch.equal(row_kernels.argmax(logits), torch.argmax(logits, dim=-1))
    assert row_kernels.argmax(logits)[1] == 17


def test_rope_store_kv_matches_reference():
    heads, kv_heads, dim, slots = 4, 2, 16, 64
    qkv = randn(6, (heads + 2 * kv_heads) * dim)
    cache = randn(2, slots, kv_heads, dim)
    cos, sin = randn(100, dim), randn(100, dim)
    positions = tensor([0, 5, 7, 3, 0, 0])
    row_slots = tensor([3, 10, 20, 33, -1, 63])  # row 4: tile padding, writes nothing
    ours, ours_cache, ref, ref_cache = qkv.clone(), cache.clone(), qkv.clone(), cache.clone()
    rotary_kernel.rope_store_kv(ours, ours_cache, cos, sin, positions, row_slots, heads, kv_heads, dim)
    reference.rope_store_kv(ref, ref_cache, cos, sin, positions, row_slots, heads, kv_heads, dim)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours_cache, ref_cache, rtol=1e-6, atol=1e-6)
    untouched = torch.ones(slots, dtype=torch.bool, device=KERNEL_DEVICE)
    untouched[[3, 10, 20, 33, 63]] = False
    assert torch.equal(ours_cache[:, untouched], cache[:, untouched])


def paged_case(heads: int, kv_heads: int):
    """Three channels over a pool of 12 blocks of 16 keys, their tables full of holes (blocks in no order, blocks
    nobody owns in between); every slot no channel owns is NaN, so a read past a row's own keys would show."""
    dim, block = 16, 16
    cache = torch.full((2, 12 * block, kv_heads, dim), float("nan"), device=KERNEL_DEVICE)
    tables = {0: [7, 2, 9, 4], 1: [3], 2: [11, 0]}
    lengths = {0: 50, 1: 9, 2: 17}
    for channel, table in tables.items():
        for position in range(lengths[channel]):
            slot = table[position // block] * block + position % block
            cache[:, slot] = randn(2, kv_heads, dim)
    # rows: channel 0 decoding at 50 keys; channel 1 a prefill chunk of its 9 keys (causal: 1..9); channel 2 decoding
    # at 17 keys; one padding row (length 0)
    row_channels = [0] + [1] * 9 + [2, 0]
    row_lengths = [50] + list(range(1, 10)) + [17, 0]
    width = 4
    table_rows = tensor([(tables[c] + [0] * width)[:width] for c in row_channels]).int()
    return randn(len(row_channels), heads, dim), cache, table_rows, tensor(row_lengths).int()


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (6, 2)], ids=["gqa2", "gqa3-masked"])
def test_paged_attention_matches_reference_and_is_row_invariant(heads, kv_heads):
    q, cache, tables, lengths = paged_case(heads, kv_heads)
    out = attention_kernel.paged_attention(q, cache, tables, lengths, 16, 0.25)
    assert torch.isfinite(out).all(), "a row read a key it does not own"
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))  # the padding row
    real = lengths > 0
    clean = torch.nan_to_num(cache)  # the reference gathers whole blocks (masked after): no NaN to multiply by 0
    torch.testing.assert_close(out[real], reference.paged_attention(q, clean, tables, lengths, 16, 0.25)[real],
                               rtol=1e-5, atol=1e-5)
    each_row_alone_equals(out, lambda rows: attention_kernel.paged_attention(
        q[rows], cache, tables[rows].contiguous(), lengths[rows].contiguous(), 16, 0.25))


def test_paged_attention_reads_queries_in_place_from_fused_rows():
    """q as a view into the fused qkv rows (row stride wider than heads × dim), as the model passes it."""
    q, cache, tables, lengths = paged_case(4, 2)
    fused = torch.cat([q.flatten(1), randn(q.shape[0], 64)], dim=1)
    view = fused.narrow(1, 0, 64).view(-1, 4, 16)
    assert torch.equal(attention_kernel.paged_attention(view, cache, tables, lengths, 16, 0.25),
                       attention_kernel.paged_attention(q, cache, tables, lengths, 16, 0.25))


def k_blocked(rows: int, scales: list[float]) -> torch.Tensor:
    """[rows, BLOCK_K × len(scales)]: small integers times a power of two that changes from one k block to the next.
    Within a block every product and partial sum is exact in fp32 (any summation order, BLAS or MMA, gives the same
    bits); across blocks the sums have different exponents, so adding them rounds and their order shows. The test
    then sees the kernel's own decisions (its k blocks and their order, no split-K, the tile config) and not how
    numpy's BLAS orders a block's products (OPENBLAS_CORETYPE moves that with a row's place in the block)."""
    ints = torch.randint(-8, 9, (rows, gemm_kernel.BLOCK_K * len(scales)), generator=gen).float()
    return (ints * torch.tensor(scales).repeat_interleave(gemm_kernel.BLOCK_K)).to(KERNEL_DEVICE)


def sum_k_blocks(x: torch.Tensor, weight: torch.Tensor, order: list[int]) -> torch.Tensor:
    """x Wᵀ in fp32, each k block's dot exact (float64, then fp32: exact for these inputs), blocks added in order."""
    acc = torch.zeros(x.shape[0], weight.shape[0], device=x.device)
    for block in order:
        ks = slice(block * gemm_kernel.BLOCK_K, (block + 1) * gemm_kernel.BLOCK_K)
        acc = acc + (x[:, ks].double() @ weight[:, ks].double().T).float()
    return acc


def test_persistent_gemm_rows_do_not_depend_on_row_count():
    scales = [2.0 ** -3, 2.0 ** -15, 2.0 ** -9]  # three k blocks whose sums round when added
    x, weight = k_blocked(70, scales), k_blocked(150, scales)
    bias = randn(150)  # 70 rows: two row tiles, the last one partial; 150 columns: two column tiles
    full = gemm_kernel.persistent_linear(x, weight, bias)
    torch.testing.assert_close(full, F.linear(x, weight, bias), rtol=1e-4, atol=1e-4)
    in_order = sum_k_blocks(x, weight, [0, 1, 2]) + bias
    assert not torch.equal(in_order, sum_k_blocks(x, weight, [2, 1, 0]) + bias), "inputs blind to the k order"
    if KERNEL_DEVICE.type == "cpu":  # the interpreter: one dot per k block, added to the accumulator left to right
        assert torch.equal(full, in_order), "the kernel's k order is not its BLOCK_K blocks left to right"
    for start, rows in [(0, 1), (5, 3), (60, 10), (3, 64)]:
        part = gemm_kernel.persistent_linear(x[start: start + rows], weight, bias)
        assert torch.equal(part, full[start: start + rows]), f"rows {start}..{start + rows} at M={rows}"
    assert torch.equal(gemm_kernel.persistent_linear(x, weight, None, programs=1) + 0,
                       gemm_kernel.persistent_linear(x, weight, None, programs=3))  # tile order: no effect
