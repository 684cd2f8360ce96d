"""Which model class runs each Hugging Face model_type (keep in sync with SUPPORTED_ARCHITECTURES).

Adding a family: a small file with a LlamaModel subclass that overrides what differs (make_layer,
embed, logits), its config fields in model_config.py, any weight renaming in weights.py, and a parity
plus batch-invariance test in tests/model/test_families.py.
"""
from __future__ import annotations

from kev.model.gemma import Gemma2Model, Gemma3Model
from kev.model.llama import LlamaModel
from kev.model.model_config import ModelConfig
from kev.model.phi3 import Phi3Model
from kev.model.qwen3 import Qwen3Model

FAMILIES: dict[str, type[LlamaModel]] = {
    "llama": LlamaModel,
    "mistral": LlamaModel,  # sliding window: an AttentionVariant on each layer (attention.layer_variant)
    "qwen2": LlamaModel,
    "qwen3": Qwen3Model,
    "gemma2": Gemma2Model,
    "gemma3_text": Gemma3Model,  # text-only checkpoints (Gemma3ForCausalLM); multimodal "gemma3" is not supported
    "phi3": Phi3Model,
}


def model_class(cfg: ModelConfig) -> type[LlamaModel]:
    return FAMILIES[cfg.model_type]
