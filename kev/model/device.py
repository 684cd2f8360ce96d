"""Which torch device a config's `core.device` names (a leaf: anything may import it)."""
from __future__ import annotations

import torch


def pick_device(name: str) -> torch.device:
    """`auto`: the first CUDA device where there is one, else the CPU; any other name as torch reads it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
