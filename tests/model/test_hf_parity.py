"""Kev's decoder against Hugging Face transformers on the same weights (fp32): max |Δ| / max |ref| ≤ 1e-4."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kev.model.model_store import resolve_model_path  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "Kev的隔离通道是如何实现的",
    "def quick_sort(arr):\n    if len(arr) <= 1:",
]


@pytest.fixture(scope="module")
def hf_model():
    folder = resolve_model_path("smollm2-135m-instruct")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine({"core": {"prefill_chunk": 8, "max_step_tokens": 64}}, record_logits=True)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_logits_match_transformers(engine, hf_model, prompt):
    result = engine.generate([{"prompt": prompt}], max_tokens=6, timeout=300)[0]
    assert result.status == "ok", result.error
    prompt_ids = engine.tokenizer.encode(prompt)
    ids = torch.tensor([prompt_ids + result.token_ids[:-1]])
    with torch.no_grad():
        reference = hf_model(ids).logits[0, len(prompt_ids) - 1:].float()  # [completion, vocab]
    ours = result.logits
    assert ours.shape == reference.shape
    relative = (ours - reference).abs().max() / reference.abs().max()
    print(f"{prompt[:20]!r}: max|Δ|/max|ref| = {relative:.2e}")
    assert relative <= 1e-4
    assert result.token_ids == reference.argmax(-1).tolist()
