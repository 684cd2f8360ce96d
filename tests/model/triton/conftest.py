"""Kev's Triton kernels on this CPU: TRITON_INTERPRET=1 runs them on CPU tensors through numpy, one program at a time
(fp32 only, slow: shapes stay tiny). It proves structure and batch invariance, not the GPU's bits. Set before any
kernel module is imported (triton.jit reads it when a kernel is defined). KEV_TEST_DEVICE=cuda (bench/gpu.sh on a
GPU machine): the kernel tests compile and run the kernels on the GPU instead."""
from __future__ import annotations

import os

import pytest
import torch

from kev.model.model_config import ModelConfig

KERNEL_DEVICE = torch.device(os.environ.get("KEV_TEST_DEVICE", "cpu"))
if KERNEL_DEVICE.type == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

TINY = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=16, rope_theta=10000.0, tie_word_embeddings=True)


def needs_triton(device: torch.device) -> None:
    """Skip, with the reason, where the kernels cannot run on device here."""
    pytest.importorskip("triton", reason="triton is not installed (pip install triton: Kev's CUDA kernels)")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")
    if device.type == "cuda" and not torch.cuda.is_available():
        pytest.skip("KEV_TEST_DEVICE=cuda but no CUDA device")
