"""Kev's CUDA backend: batch-invariant Triton kernels for the per-row work of a step.

Every kernel here runs one program per row (or per row and key/value head, or per fixed output tile), and a row's
reductions walk only what that row owns (its hidden size, its own keys in fixed tiles of the cache block size), in an
order fixed by those sizes alone. So a row's bits never depend on how many rows share the step: the rule
batch_invariant_ops, SGLang's and vLLM's deterministic modes converged on (shared/notes/gpu-path-facts.md).

The torch ops in kev/model/llama.py stay the reference path; kev/model/triton/reference.py holds the same operations in
torch over the same static, tensor-only metadata (the tests' reference, and the CPU stand-in for the graphed step).
Triton kernels are used on CUDA when `triton` imports; under TRITON_INTERPRET=1 they also run on CPU tensors (the
tests: fp32 only, slow, numpy's numerics: they prove structure and invariance, not the GPU's bits).
"""
from __future__ import annotations

import importlib.util
import os

import torch


def triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """TRITON_INTERPRET=1: kernels run on CPU tensors through numpy (tests)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_runs_on(device: torch.device) -> bool:
    """Whether Kev's Triton kernels can run on tensors of this device here."""
    if not triton_importable():
        return False
    return device.type == "cuda" or (device.type == "cpu" and interpreting())
