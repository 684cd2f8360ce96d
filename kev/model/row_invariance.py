"""Start-up probe: does a row's GEMM result depend on how many rows share the call?

For each distinct linear shape of the model, with the kernel the model will use, rows of
M-row products are compared with the same rows of one big product, for every M from 1
to 64, every 32nd M beyond, the powers of two ±1 and the largest M a step can have
(max_step_tokens; the lm_head: max_parallel_queries), each over windows covering at least 64
rows of data. Where every M ≥ min_rows gives one value per row, a step may
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
    sizes = set(range(1, min(64, max_rows) + 1)) | set(range(64, max_rows + 1, 32)) | {max_rows}
    power = 2
    while power <= max_rows:
        sizes |= {power - 1, power, min(power + 1, max_rows)}
        power *= 2
    return sorted(sizes)


def probe_data(rows: int, columns: int, seed: int) -> torch.Tensor:
    """Normal values mixed with zeros, large values and subnormals: real activations have all of them
    (SiLU makes subnormals), and some instructions (AVX512-BF16's dot product) flush subnormals that
    other code paths keep, so paths that agree on plain normal data can still differ on real data."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, columns, generator=gen)
    kind = torch.rand(rows, columns, generator=gen)
    x = torch.where(kind < 0.10, x * 1e-39, x)  # subnormal in fp32 and bf16
    x = torch.where((kind >= 0.10) & (kind < 0.15), x * 1e3, x)
    return torch.where((kind >= 0.15) & (kind < 0.20), torch.zeros_like(x), x)


def rows_agree(multiply: Multiply, in_features: int, max_rows: int, dtype: torch.dtype, device: torch.device,
               sizes: list[int], seed: int = 0) -> bool:
    """Every M in sizes gives the big product's rows, over windows covering at least 64 rows of data:
    two code paths often agree on most rows, so a few rows prove nothing."""
    x = probe_data(max(max_rows, 64), in_features, seed).to(device=device, dtype=dtype)
    reference = multiply(x)
    for m in sizes:
        covered = min(x.shape[0], max(2 * m, 64))  # windows of m rows over the first `covered` rows
        for start in range(0, covered - m + 1, m):
            if not torch.equal(multiply(x[start:start + m]), reference[start:start + m]):
                return False
    return True


def probe(multiplies: dict[str, tuple[int, Multiply, int]], dtype: torch.dtype, device: torch.device,
          cache_dir: Path | None, identity: str) -> RowInvariance:
    """multiplies: name -> (in_features, the model's own multiply, the most rows a call can have);
    identity names the model and kernel."""
    limits = sorted((name, rows) for name, (_, _, rows) in multiplies.items())
    key = _cache_key(f"{identity}|{limits}", dtype, device)
    cached = _read(cache_dir, key)
    if cached is not None:
        return cached
    device_rows = [(k, fn, rows) for k, fn, rows in multiplies.values()]
    verdict = RowInvariance(False, 1, 0)
    if all(rows_agree(fn, k, rows, dtype, device, [m for m in probe_sizes(rows) if m >= 2])
           for k, fn, rows in device_rows):
        min_rows = 1 if all(rows_agree(fn, k, rows, dtype, device, [1]) for k, fn, rows in device_rows) else 2
        verdict = RowInvariance(True, min_rows, min(rows for _, _, rows in device_rows))
    log.info("row invariance probe (%s, %d threads): %s", dtype, torch.get_num_threads(), verdict.label)
    _write(cache_dir, key, verdict)
    return verdict


def _cache_key(identity: str, dtype: torch.dtype, device: torch.device) -> str:
    device_kind = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    parts = [device_kind, torch.__version__, str(torch.get_num_threads()), str(dtype), identity]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def cpu_model() -> str:
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


def probe_tiles(multiplies: dict[str, tuple[int, Multiply, int]], tiles: list[int], dtype: torch.dtype,
                device: torch.device) -> bool:
    """Fixed row tiles on a device whose GEMM picks its kernel by shape (cuBLAS): the plan assumes a row's bits in an
    M-row tile depend on neither its place in the tile nor the other rows. Checked for every linear shape and tile
    size: the same rows shifted within the tile, and half of them beside other rows."""
    for in_features, multiply, _ in multiplies.values():
        for tile in sorted(set(tiles)):
            x = probe_data(2 * tile, in_features, seed=tile).to(device=device, dtype=dtype)
            reference = multiply(x[:tile])
            shift = max(1, tile // 3)
            shifted = multiply(torch.roll(x[:tile], shift, dims=0)).roll(-shift, dims=0)
            half = tile // 2
            mixed = multiply(torch.cat([x[:half], x[tile: 2 * tile - half]]))[:half]
            if not (torch.equal(shifted, reference) and torch.equal(mixed, reference[:half])):
                log.warning("row tile probe: rows of a %d-row GEMM (K=%d) change with their neighbours", tile,
                            in_features)
                return False
    return True
