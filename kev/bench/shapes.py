"""Llama-family shapes for random-weight benchmarks of models Kev does not ship."""
from __future__ import annotations

from kev.model.model_config import ModelConfig

SHAPES: dict[str, ModelConfig] = {
    # A dry run of the GPU scripts on a CPU (seconds, not a benchmark).
    "llama-tiny": ModelConfig(vocab_size=49152, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=64, rope_theta=10000.0, tie_word_embeddings=True),
    "llama-1b": ModelConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                            num_kv_heads=8, head_dim=64, rope_theta=500000.0, tie_word_embeddings=True),
    "llama-3b": ModelConfig(vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_layers=28, num_heads=24,
                            num_kv_heads=8, head_dim=128, rope_theta=500000.0, tie_word_embeddings=True),
    "llama-8b": ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                            num_kv_heads=8, head_dim=128, rope_theta=500000.0),
}
