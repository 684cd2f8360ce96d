"""core.precision: auto picks bf16 where the device computes it natively, fp32 elsewhere."""
from __future__ import annotations

from functools import cache
from pathlib import Path

NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
QUANTIZED = ("int8", "w8a8", "gguf")  # precisions whose weights are integers


@cache
def pick_precision(precision: str, device: str) -> str:
    if precision != "auto":
        return precision
    if _uses_cuda(device):
        import torch

        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
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
    int8 activations exist only inside the linear kernel), which compute in bf16, or fp16 on a CUDA device without
    bf16."""
    if precision not in QUANTIZED:
        return precision
    if _uses_cuda(device):
        import torch

        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16"


def describe(precision: str, device: str) -> str:
    picked = pick_precision(precision, device)
    if precision != "auto":
        return picked
    reason = "CUDA device" if _uses_cuda(device) else ("CPU has " + ", ".join(cpu_bf16_flags()) if cpu_bf16_flags()
                                                       else "CPU has no native bf16")
    return f"{picked} (core.precision auto: {reason})"


def _uses_cuda(device: str) -> bool:
    if device.startswith("cuda"):
        return True
    if device != "auto" or not Path("/proc/driver/nvidia").exists():
        return False  # no NVIDIA driver: no need to import torch to know
    import torch

    return torch.cuda.is_available()
