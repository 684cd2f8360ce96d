"""The CUDA step's structure on this CPU: the graphed decode step reads no host value and sizes nothing by a tensor's
contents (what CUDA-graph capture needs), and an engine on Kev's Triton kernels (the interpreter) answers every packed
question bit for bit as alone, with and without the decode buckets the graphs replay."""
from __future__ import annotations

import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import kev
from kev.engine.decode_graphs import DecodeGraphs, bucket_sizes
from kev.engine.engine_setup import build_parts
from kev.engine.packer import RowTiling
from kev.model.attention import PagedKVLayer
from kev.model.triton.ops import DeviceOps, reference_ops
from kev.model.weights import random_model
from tests.model.triton.conftest import TINY, needs_triton

CPU = torch.device("cpu")

# Ops that read a tensor's values on the host (.item(), .tolist() of a CUDA tensor) or give an output whose size
# depends on values: neither can be inside a CUDA graph.
HOST_READS = {"aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.unique", "aten._unique2",
              "aten.repeat_interleave"}


class OpsSeen(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def decode_graphs(ops: DeviceOps) -> tuple[DecodeGraphs, torch.Tensor]:
    """A tiny model's decode buckets; the first one's rows set to three channels decoding (one padding row)."""
    model = random_model(TINY, "fp32", torch.device("cpu"), max_positions=256)
    assert model.use_device_kernels(ops)
    caches = [PagedKVLayer(16 * 16, TINY.num_kv_heads, TINY.head_dim, torch.float32, torch.device("cpu"))
              for _ in range(TINY.num_layers)]
    for cache in caches:
        cache.kv.normal_(generator=torch.Generator().manual_seed(1))
    graphs = DecodeGraphs(model, caches, RowTiling(4, 16, paged=True), 6, 256, 16)
    assert [b.rows for b in graphs.buckets] == bucket_sizes(4, 6) == [4, 8]
    bucket = graphs.buckets[0]
    rows = bucket.meta.paged.static
    rows.input_ids.copy_(torch.tensor([5, 9, 300, 0]))
    rows.positions.copy_(torch.tensor([20, 3, 40, 0]))
    rows.slots.copy_(torch.tensor([100, 33, 150, -1]))
    rows.lengths.copy_(torch.tensor([21, 4, 41, 0]))
    rows.tables[:, :3] = torch.tensor([[2, 6, 0], [1, 0, 0], [15, 3, 9], [0, 0, 0]])
    return graphs, bucket


def test_graphed_decode_step_compiles_as_one_graph():
    """torch.compile(fullgraph=True) fails on any graph break: .item(), .tolist(), nonzero, a size read from a tensor.
    The step runs the torch reference of the kernels here (dynamo cannot trace interpreted Triton)."""
    graphs, bucket = decode_graphs(reference_ops())
    kv_before = [cache.kv.clone() for cache in graphs.caches]
    with torch.inference_mode():
        eager = graphs.step(bucket)
        for cache, kv in zip(graphs.caches, kv_before):
            cache.kv.copy_(kv)
        compiled = torch.compile(graphs.step, fullgraph=True, backend="eager")(bucket)
    assert compiled.shape == (4, TINY.vocab_size)
    assert torch.equal(compiled, eager)


def test_graphed_decode_step_on_triton_reads_no_host_value():
    needs_triton(CPU)
    from kev.model.triton.ops import triton_ops

    graphs, bucket = decode_graphs(triton_ops())
    with torch.inference_mode(), OpsSeen() as seen:
        logits = graphs.step(bucket)
    assert not seen.ops & HOST_READS, sorted(seen.ops & HOST_READS)
    assert torch.isfinite(logits).all()


@pytest.fixture(scope="module")
def tiny_engines(default_model):
    """Engines on one tiny random model: Kev's Triton kernels eagerly, the same with decode buckets, torch ops."""
    needs_triton(CPU)
    _, tokenizer = default_model  # the default model's tokenizer: the tiny model's ids are its first 512 tokens
    engines = {}
    for name, kernels in [("triton", "triton"), ("graphs", "triton"), ("triton-gemm", "triton"), ("torch", "torch")]:
        # a model each (the same seed, the same weights): an engine sets its model's kernels
        model = random_model(TINY, "fp32", torch.device("cpu"), max_positions=256)
        gemm = {"gpu_linear": "triton", "row_plan": "tiles"} if name == "triton-gemm" else {}  # tiles: no slow probe
        config = kev.load_config({"router": {"max_parallel_queries": 6, "channel_pool_size": 6,
                                             "strategy": "round_robin", "default_timeout_ms": 600_000},
                                  "core": {"precision": "fp32", "max_context": 256, "kernels": kernels,
                                           "prefill_chunk": 16, "max_step_tokens": 64, "linear_tile": 4, **gemm}})
        engine = kev.Engine(config, build_parts(config, model, tokenizer), record_logits=True)
        if name == "graphs":  # on CUDA build_parts captures them; here the same buckets run eagerly
            engine.runner.use_decode_graphs(6, 256)
        engines[name] = engine
    yield engines
    for engine in engines.values():
        engine.close()


def questions() -> list[dict]:
    rng = random.Random(0)
    return [{"prompt_ids": [rng.randrange(TINY.vocab_size) for _ in range(n)], "max_tokens": 3, "ignore_eos": True}
            for n in (5, 37, 18)]  # 37: three prefill chunks of 16


def test_triton_engine_packed_equals_solo_and_graph_buckets_change_no_bit(tiny_engines):
    triton_engine = tiny_engines["triton"]
    assert triton_engine.runner.tiling.paged and triton_engine.runner.model.device_kernels is not None
    solo = [triton_engine.generate([q], timeout=600)[0] for q in questions()]
    for name in ("triton", "graphs"):
        packed = tiny_engines[name].generate(questions()[::-1], timeout=600)[::-1]
        for alone, together in zip(solo, packed):
            assert together.status == "ok", together.error
            assert together.token_ids == alone.token_ids
            assert torch.equal(together.logits, alone.logits), f"{name}: packed logits differ from solo"
    graphs = tiny_engines["graphs"].runner.graphs
    assert graphs is not None and graphs.steps_run >= 2  # the decode-only steps ran over the buckets
    reference = tiny_engines["torch"].generate(questions(), timeout=600)
    for ours, theirs in zip(solo, reference):  # the kernels against torch's ops: same tokens, logits within fp32 noise
        assert ours.token_ids == theirs.token_ids
        torch.testing.assert_close(ours.logits, theirs.logits, rtol=1e-4, atol=1e-4)
    assert triton_engine.runner.fingerprint != tiny_engines["torch"].runner.fingerprint


def test_persistent_gemm_engine_packed_equals_solo(tiny_engines):
    """core.gpu_linear triton: every linear layer on the persistent Triton GEMM (interpreted)."""
    engine = tiny_engines["triton-gemm"]
    assert engine.runner.model.first_blocks()[0].qkv_proj.packed.kernel == "triton-persistent-gemm"
    assert engine.runner.fingerprint != tiny_engines["triton"].runner.fingerprint
    solo = [engine.generate([q], timeout=600)[0] for q in questions()]
    packed = engine.generate(questions()[::-1], timeout=600)[::-1]
    reference = tiny_engines["torch"].generate(questions(), timeout=600)
    for alone, together, theirs in zip(solo, packed, reference):
        assert together.token_ids == alone.token_ids and torch.equal(together.logits, alone.logits)
        torch.testing.assert_close(alone.logits, theirs.logits, rtol=1e-4, atol=1e-4)


def test_gemma_takes_the_triton_norms_and_geglu_and_keeps_torch_attention(tmp_path, default_model):
    """Gemma 2 (windows, soft-caps): its attention stays on torch (no PagedRows, no graphs), its norms and GeGLU run
    the Triton kernels; packed == solo bit for bit, and within fp32 noise of the torch path."""
    needs_triton(CPU)
    transformers = pytest.importorskip("transformers")
    from kev.model.weights import load_model
    from tests.model.test_families import CONFIGS, _randomise

    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(CONFIGS["gemma2"](), dtype=torch.float32).eval()
    _randomise(reference)
    reference.save_pretrained(tmp_path)
    _, tokenizer = default_model
    results = {}
    for kernels in ("triton", "torch"):
        config = kev.load_config({"core": {"max_context": 256, "precision": "fp32", "kernels": kernels},
                                  "router": {"strategy": "round_robin", "max_parallel_queries": 4,
                                             "channel_pool_size": 4, "default_timeout_ms": 600_000}})
        model = load_model(tmp_path, "fp32", CPU, 256)
        with kev.Engine(config, build_parts(config, model, tokenizer), record_logits=True) as engine:
            if kernels == "triton":
                assert model.device_kernels is None and not engine.runner.tiling.paged  # attention: torch
                assert model.layers[0].mlp.device_ops is not None  # GeGLU: Triton
                solo = [engine.generate([q], timeout=600)[0] for q in questions()]
                packed = engine.generate(questions()[::-1], timeout=600)[::-1]
                assert all(torch.equal(a.logits, b.logits) for a, b in zip(solo, packed))
            results[kernels] = engine.generate(questions(), timeout=600)
    for ours, theirs in zip(results["triton"], results["torch"]):
        assert ours.token_ids == theirs.token_ids
        torch.testing.assert_close(ours.logits, theirs.logits, rtol=1e-4, atol=1e-4)
