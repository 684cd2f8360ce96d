"""Kev's Triton kernels on this CPU: TRITON_INTERPRET=1 runs them on CPU tensors through numpy, one program at a time
(fp32 only, slow: shapes stay tiny). It proves structure and batch invariance, not the GPU's bits. Set before any
kernel module is imported (triton.jit reads it when a kernel is defined)."""
from __future__ import annotations

import os

import pytest
import torch

from kev.model.model_config import ModelConfig

os.environ.setdefault("TRITON_INTERPRET", "1")

TINY = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=16, rope_theta=10000.0, tie_word_embeddings=True)


def needs_triton() -> None:
    """Skip, with the reason, where the kernels cannot run here."""
    pytest.importorskip("triton", reason="triton is not installed (pip install triton: Kev's CUDA kernels)")
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no CUDA device and TRITON_INTERPRET is not 1")
