"""core.precision auto: a GGUF's own blocks on a CPU (as llama.cpp runs a .gguf); otherwise bf16 where the device
computes it natively, fp32 elsewhere. Also the dtype activations and K/V take under each precision."""
from __future__ import annotations

from functools import cache
from pathlib import Path

from kev.config.model_aliases import names_gguf

NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
QUANTIZED = ("int8", "w8a8", "gguf")  # precisions whose weights are integers


@cache
def pick_precision(precision: str, device: str, model_path: str = "", tensor_parallel: int = 1,
                   kernels: str = "auto") -> str:
    if precision != "auto":
        return precision
    if _uses_cuda(device):
        import torch

        # A GGUF's blocks have CPU kernels only (on CUDA they would run torch's reference ops): 16-bit floats.
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if names_gguf(model_path) and _gguf_refusal(tensor_parallel, kernels) is None:
        return "gguf"
    return "bf16" if cpu_bf16_flags() else "fp32"


@cache
def cpu_bf16_flags() -> tuple[str, ...]:
    """The CPU's native bf16 instruction sets (from /proc/cpuinfo; empty where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ()
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return tuple(flag for flag in NATIVE_BF16_CPU_FLAGS if flag in flags)


def activation_precision(precision: str, device: str) -> str:
    """The dtype of activations and K/V: the precision itself, except int8 (weight-only), gguf and w8a8 (their
    int8 activations exist only inside the linear kernel), which compute in bf16 where the device has it natively
    (fp16 on a CUDA device without bf16), else fp32: a CPU without avx512_bf16 / AMX (Zen 3, AVX2 only) emulates
    bf16, and the GGUF's default model ran 1.5x faster with fp32 activations there (bench/results/precision_auto.md)."""
    if precision not in QUANTIZED:
        return precision
    if _uses_cuda(device):
        import torch

        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if cpu_bf16_flags() else "fp32"


def describe(precision: str, device: str, model_path: str = "", tensor_parallel: int = 1,
             kernels: str = "auto") -> str:
    """The precision and, under auto, why it was picked (the start-up banner prints this)."""
    picked = pick_precision(precision, device, model_path, tensor_parallel, kernels)
    if precision != "auto":
        return picked
    if _uses_cuda(device):
        reason = "CUDA device"
    elif picked == "gguf":
        reason = "a .gguf model runs its own blocks"
    else:
        flags = cpu_bf16_flags()
        reason = "CPU has " + ", ".join(flags) if flags else "CPU has no native bf16"
        refusal = _gguf_refusal(tensor_parallel, kernels)
        if names_gguf(model_path) and refusal is not None:
            reason += f"; not the .gguf model's own blocks: {refusal}"
    if picked in QUANTIZED:
        reason += f"; activations {activation_precision(picked, device)}"
    return f"{picked} (core.precision auto: {reason})"


def _gguf_refusal(tensor_parallel: int, kernels: str) -> str | None:
    """Why a GGUF model's own blocks are not auto's pick on a CPU; None when they are."""
    if tensor_parallel > 1:
        return "core.tensor_parallel splits float or int8 weights only"
    if kernels != "auto":
        return f"core.kernels {kernels}: the blocks need Kev's CPU kernels (torch's ops dequantize them every step)"
    return None


def _uses_cuda(device: str) -> bool:
    if device.startswith("cuda"):
        return True
    if device != "auto" or not Path("/proc/driver/nvidia").exists():
        return False  # no NVIDIA driver: no need to import torch to know
    import torch

    return torch.cuda.is_available()
