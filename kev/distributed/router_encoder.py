"""What the router of a cluster loads: the tokenizer and the input-embedding table, not the model.

With them it checks prompt lengths and computes the same semantic bucket as a single-mode
engine (MeanEmbedder over the same table, at the same precision), for a fraction of the
memory and start-up time of the whole model.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from kev.config import KevConfig
from kev.engine.embedder import MeanEmbedder
from kev.model.model_config import ModelConfig
from kev.model.model_store import resolve_model_path
from kev.model.tokenizer import Tokenizer
from kev.model.weights import DTYPES

_EMBED_KEYS = ("model.embed_tokens.weight", "embed_tokens.weight")


@dataclass(frozen=True)
class RouterModel:
    tokenizer: Tokenizer
    encoder: MeanEmbedder
    vocab_size: int


def load_router_model(config: KevConfig) -> RouterModel:
    folder = resolve_model_path(config.core.model_path)
    tokenizer = Tokenizer.from_folder(folder, config.core.chat_template)  # the workers' template: same prompts
    weight = _embedding_table(folder).float().to(DTYPES[config.core.activation_precision])  # as load_model leaves it
    return RouterModel(tokenizer, MeanEmbedder(weight, tokenizer), ModelConfig.from_folder(folder).vocab_size)


def _embedding_table(folder: Path) -> torch.Tensor:
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(file, framework="pt") as handle:
            key = next((k for k in _EMBED_KEYS if k in handle.keys()), None)
            if key is not None:
                return handle.get_tensor(key)  # [vocab, hidden]
    raise ValueError(f"{folder}: no input embedding table ({' or '.join(_EMBED_KEYS)}) in its safetensors")
