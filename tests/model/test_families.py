"""Families beyond Llama: Qwen3 (q/k norms), Gemma 2 (GeGLU, scaled embeddings, (1 + w) norms, soft-capping,
alternating sliding windows), Phi-3 (fused checkpoints, partial rotary) and sliding windows (Mistral, Qwen2).

Each tiny random model is saved with transformers and loaded by Kev from the same folder: its logits must match
transformers' (fp32, max |Δ| / max |ref| ≤ 1e-4) with Kev's C++ kernels and without, prefilled in short chunks
(the kernel path) and in one long chunk (SDPA); and a packed batch must equal each question run alone, bit for bit.
Windows are 16 keys and prompts up to 70 tokens, so every windowed layer hides keys.
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

import kev
from kev.engine.engine_setup import build_parts
from kev.model.families import FAMILIES
from kev.model.model_config import SUPPORTED_ARCHITECTURES
from kev.model.weights import load_model

transformers = pytest.importorskip("transformers")

SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             pad_token_id=0, eos_token_id=2, num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.15)
WINDOW = 16

CONFIGS = {
    "qwen3": lambda: transformers.Qwen3Config(**SHAPE, head_dim=16, tie_word_embeddings=True),
    "gemma2": lambda: transformers.Gemma2Config(**SHAPE, head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW,
                                                attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
    "gemma3": lambda: transformers.Gemma3TextConfig(**SHAPE, head_dim=16, query_pre_attn_scalar=24,
                                                    sliding_window=WINDOW, sliding_window_pattern=2,
                                                    rope_parameters={"full_attention": {"rope_type": "linear",
                                                                                        "factor": 4.0,
                                                                                        "rope_theta": 1e6},
                                                                     "sliding_attention": {"rope_type": "default",
                                                                                           "rope_theta": 1e4}}),
    "phi3": lambda: transformers.Phi3Config(**SHAPE, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                      "partial_rotary_factor": 0.5}),
    "phi3-window": lambda: transformers.Phi3Config(**SHAPE, sliding_window=WINDOW),
    "mistral-window": lambda: transformers.MistralConfig(**SHAPE, sliding_window=WINDOW),
    "qwen2-window-layer1": lambda: transformers.Qwen2Config(**SHAPE, use_sliding_window=True, sliding_window=WINDOW,
                                                            max_window_layers=1),
}
PROMPT_LENGTHS = [3, 12, 37, 70]


def _randomise(model: torch.nn.Module) -> None:
    """transformers starts norms at exactly 1 (Gemma: 0) and biases at 0; perturb them so they matter."""
    generator = torch.Generator().manual_seed(1)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight") or name.endswith(".bias"):
            param.data += 0.3 * torch.randn(param.shape, generator=generator)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def family(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, torch.nn.Module]:
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(CONFIGS[request.param](), dtype=torch.float32).eval()
    _randomise(reference)
    folder = tmp_path_factory.mktemp(request.param)
    reference.save_pretrained(folder)
    return request.param, folder, reference


def _engine(folder: Path, tokenizer, overrides: dict, precision: str = "fp32") -> kev.Engine:
    config = kev.load_config({"core": {"max_context": 256, "precision": precision},
                              "aggregator": {"timeout_ms": 600_000},
                              "router": {"strategy": "round_robin", "max_parallel_queries": 8,
                                         "channel_pool_size": 12}}, overrides)
    model = load_model(folder, precision, torch.device("cpu"), 256)
    return kev.Engine(config, build_parts(config, model, tokenizer), record_logits=True)


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(2)
    return [torch.randint(0, 512, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


@pytest.mark.parametrize("kernels", ["auto", "torch"])
@pytest.mark.parametrize("chunk", [8, 64])
def test_logits_match_transformers(family, default_model, kernels: str, chunk: int) -> None:
    """chunk 64: whole prompts in one chunk (the prefill kernel, or a soft-capped layer's per-chunk gather)."""
    name, folder, reference = family
    engine = _engine(folder, default_model[1], {"core": {"prefill_chunk": chunk, "kernels": kernels}})
    try:
        prompts = _prompts()
        questions = [{"prompt_ids": p, "max_tokens": 6, "ignore_eos": True} for p in prompts]
        results = engine.generate(questions, timeout=300)
    finally:
        engine.close()
    for prompt, result in zip(prompts, results):
        assert result.status == "ok", result.error
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + result.token_ids[:-1]])).logits[0, len(prompt) - 1:]
        relative = (result.logits - logits).abs().max() / logits.abs().max()
        assert relative <= 1e-4, f"{name}, {len(prompt)}-token prompt, chunk {chunk}, kernels {kernels}: {relative:.2e}"
        assert result.token_ids == logits.argmax(-1).tolist()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_packed_batch_equals_solo(family, default_model, precision: str) -> None:
    name, folder, _ = family
    engine = _engine(folder, default_model[1], {"core": {"prefill_chunk": 16, "max_step_tokens": 64}}, precision)
    try:
        prompts = _prompts() + [p[::-1] for p in _prompts()]
        ask = lambda ps: [{"prompt_ids": p, "max_tokens": 8, "ignore_eos": True} for p in ps]  # noqa: E731
        solo = [engine.generate(ask([p]), timeout=300)[0] for p in prompts]
        order = list(range(len(prompts)))
        random.Random(0).shuffle(order)
        packed = engine.generate(ask([prompts[i] for i in order]), timeout=300)
    finally:
        engine.close()
    assert len({r.channel_id for r in packed}) == len(prompts), "each question has its own channel"
    for i, result in zip(order, packed):
        assert result.status == "ok", result.error
        assert result.token_ids == solo[i].token_ids, f"{name} ({precision}): tokens of prompt {i} differ"
        assert torch.equal(result.logits, solo[i].logits), f"{name} ({precision}): logits of prompt {i} differ"


def test_every_supported_architecture_has_a_family() -> None:
    assert set(FAMILIES) == SUPPORTED_ARCHITECTURES


def test_refusals_name_the_key_and_what_runs() -> None:
    from kev.errors import UnsupportedModelError
    from kev.model.model_config import ModelConfig
    from kev.model.rope import RotaryTable

    raw = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 4}
    with pytest.raises(UnsupportedModelError, match="hidden activation 'gelu' is not supported for model_type 'llama'"):
        ModelConfig.from_hf_dict({**raw, "model_type": "llama", "hidden_act": "gelu"})
    phi3_128k = ModelConfig.from_hf_dict({**raw, "model_type": "phi3", "rope_scaling": {"rope_type": "longrope"}})
    with pytest.raises(UnsupportedModelError, match="rope_scaling type 'longrope' is not supported"):
        RotaryTable(phi3_128k.head_dim, phi3_128k.rope_theta, phi3_128k.rope_scaling, 16)
