"""Start-up probe: does a row's GEMM result depend on how many rows share the call?

For each distinct linear shape of the model, with the kernel the model will use, rows of
M-row products are compared with the same rows of one big product, for every M from 1
to 64, every 16th M beyond, the powers of two ±1 and the largest M a step can have
(max_step_tokens), and at a few row offsets. Where every M ≥ min_rows gives one value per row, a step may
multiply all its rows in one GEMM ("free rows"). Anything else falls back to fixed
tiles. The verdict depends on the kernel, the shape, the CPU and the thread count, so it
is cached per (machine, torch, threads, dtype, shapes) under ~/.cache/kev and recorded
in the numerics fingerprint.
"""
from __future__ import annotations

import hashlib
import json
import logging
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

log = logging.getLogger("kev.model")

Multiply = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class RowInvariance:
    free_rows: bool  # True: one GEMM per step is as invariant as fixed tiles
    min_rows: int  # pad every GEMM to at least this many rows (M=1 may take another path)
    max_rows: int  # verified up to this many rows

    @property
    def label(self) -> str:
        return f"free-rows[{self.min_rows},{self.max_rows}]" if self.free_rows else "fixed-tiles"


def probe_sizes(max_rows: int) -> list[int]:
    sizes = set(range(1, min(64, max_rows) + 1)) | set(range(16, max_rows + 1, 16)) | {max_rows}
    power = 2
    while power <= max_rows:
        sizes |= {power - 1, power, min(power + 1, max_rows)}
        power *= 2
    return sorted(sizes)


def rows_agree(multiply: Multiply, in_features: int, max_rows: int, dtype: torch.dtype, device: torch.device,
               min_rows: int, seed: int = 0) -> bool:
    """Every M in probe_sizes (M ≥ min_rows), at offsets 0 and a few others, gives the big product's rows."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(max_rows + 40, in_features, generator=gen).to(device=device, dtype=dtype)
    reference = multiply(x)
    for m in probe_sizes(max_rows):
        if m < min_rows:
            continue
        for offset in (0, 1, 17, 40) if m <= 64 else (0, 13):
            if not torch.equal(multiply(x[offset:offset + m]), reference[offset:offset + m]):
                return False
    return True


def probe(multiplies: dict[str, tuple[int, Multiply]], max_rows: int, dtype: torch.dtype, device: torch.device,
          cache_dir: Path | None, identity: str) -> RowInvariance:
    """multiplies: name -> (in_features, the model's own multiply); identity names the model and kernel."""
    key = _cache_key(identity, max_rows, dtype, device)
    cached = _read(cache_dir, key)
    if cached is not None:
        return cached
    verdict = RowInvariance(False, 1, 0)
    for min_rows in (1, 2):
        if all(rows_agree(fn, k, max_rows, dtype, device, min_rows) for k, fn in multiplies.values()):
            verdict = RowInvariance(True, min_rows, max_rows)
            break
    log.info("row invariance probe (%s, %d threads): %s", dtype, torch.get_num_threads(), verdict.label)
    _write(cache_dir, key, verdict)
    return verdict


def _cache_key(identity: str, max_rows: int, dtype: torch.dtype, device: torch.device) -> str:
    device_kind = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_model()
    parts = [device_kind, torch.__version__, str(torch.get_num_threads()), str(dtype), identity, str(max_rows)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _read(cache_dir: Path | None, key: str) -> RowInvariance | None:
    if cache_dir is None:
        return None
    try:
        return RowInvariance(**json.loads((cache_dir / f"{key}.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _write(cache_dir: Path | None, key: str, verdict: RowInvariance) -> None:
    if cache_dir is None:
        return
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        (cache_dir / f"{key}.json").write_text(json.dumps(asdict(verdict)))
    except OSError as error:  # a read-only home still runs; it only probes again next time
        log.warning("row invariance verdict not cached: %s", error)
