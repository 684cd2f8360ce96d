"""Variants the default model does not exercise: untied head, llama3 RoPE scaling, Qwen2 QKV bias, GQA ratios.

Tiny random models are saved with transformers, loaded by Kev from the same folder,
and compared logit by logit (fp32, ≤ 1e-4 relative).
"""
from __future__ import annotations

import pytest
import torch

import kev
from kev.engine.engine_setup import build_parts
from kev.model.weights import load_model

transformers = pytest.importorskip("transformers")

VARIANTS = {
    "llama-untied-llama3-rope": transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, rope_theta=50000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64}),
    "qwen2-bias": transformers.Qwen2Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=True),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_matches_transformers(name, tmp_path, default_model):
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(VARIANTS[name], dtype=torch.float32).eval()
    if name.startswith("qwen2"):  # transformers initialises biases to zero; make them matter
        for layer in reference.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.data.normal_(0, 0.5)
    reference.save_pretrained(tmp_path)
    config = kev.load_config({"core": {"max_context": 256, "prefill_chunk": 8},
                              "router": {"default_timeout_ms": 600_000}})
    model = load_model(tmp_path, "fp32", torch.device("cpu"), 256)
    engine = kev.Engine(config, build_parts(config, model, default_model[1]), record_logits=True)
    prompt = torch.randint(0, 512, (37,)).tolist()
    result = engine.generate([{"prompt_ids": prompt, "max_tokens": 5, "ignore_eos": True}], timeout=120)[0]
    engine.close()
    with torch.no_grad():
        logits = reference(torch.tensor([prompt + result.token_ids[:-1]])).logits[0, len(prompt) - 1:]
    relative = (result.logits - logits).abs().max() / logits.abs().max()
    assert relative <= 1e-4, f"{name}: {relative:.2e}"
