"""Kev's Triton kernels on this CPU: TRITON_INTERPRET=1 runs them on CPU tensors through numpy, one program at a time
(fp32 only, slow: shapes stay tiny). It proves structure and batch invariance, not the GPU's bits. Set before any
kernel module is imported (triton.jit reads it when a kernel is defined). KEV_TEST_DEVICE=cuda (bench/gpu.sh on a
GPU machine): the kernel tests compile and run the kernels on the GPU instead.

Under the interpreter `tl.dot` is numpy's matmul, and OpenBLAS's bits for a row depend on where the row sits in the
block (OPENBLAS_CORETYPE=Haswell, this project's default kernel on some machines: rows 6-15 of each 16 differ from
the same row at 0-5). A GPU's MMA gives a row the same bits wherever it sits, and the kernels' batch invariance
rests on that; so here each dot is computed row by row in a fixed order (row_independent_dot), and the tests check
what the kernels decide (tiles, k order, no split-K), not numpy's BLAS. The environment's variables stay as they are."""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kev.model.model_config import ModelConfig

KERNEL_DEVICE = torch.device(os.environ.get("KEV_TEST_DEVICE", "cpu"))
if KERNEL_DEVICE.type == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

TINY = ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=16, rope_theta=10000.0, tie_word_embeddings=True)


def _row_independent_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
    """The interpreter's create_dot (fp32 operands; the tests cast to fp32), each output's products summed over k in
    order, the same for every row: a row's bits depend on its own data alone, as on the GPU."""
    from triton.runtime.interpreter import TensorHandle

    products = a.data[:, :, None].astype(d.data.dtype) * b.data[None, :, :].astype(d.data.dtype)
    return TensorHandle(products.sum(axis=1, dtype=d.data.dtype) + d.data, d.dtype.scalar)


@pytest.fixture(scope="package", autouse=True)
def row_independent_dot() -> Iterator[None]:
    """For every test of this folder under the interpreter (see the module docstring); nothing on a GPU."""
    interpreter = None
    if KERNEL_DEVICE.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        try:
            from triton.runtime import interpreter
        except ImportError:  # the tests skip without triton
            pass
    if interpreter is None:
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(interpreter.InterpreterBuilder, "create_dot", _row_independent_dot)
        yield


def needs_triton(device: torch.device) -> None:
    """Skip, with the reason, where the kernels cannot run on device here."""
    pytest.importorskip("triton", reason="triton is not installed (pip install triton: Kev's CUDA kernels)")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1")
    if device.type == "cuda" and not torch.cuda.is_available():
        pytest.skip("KEV_TEST_DEVICE=cuda but no CUDA device")
