"""Kev's small C++ kernels (CPU), built once with torch's extension builder and cached under
~/.cache/kev/kernels. Where they cannot be built (no compiler), the model runs on torch ops and
says so in its numerics fingerprint."""
from __future__ import annotations

import fcntl
import hashlib
import logging
import platform
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

log = logging.getLogger("kev.model")

SOURCES = [Path(__file__).with_name(name)
           for name in ("paged_attention.cpp", "row_ops.cpp", "linear_gemm.cpp", "decoder_layers.cpp",
                        "prefill_attention.cpp", "quant_gemm.cpp", "w8a8_gemm.cpp", "head_rescore.cpp")]
# -fopenmp: at::parallel_for is OpenMP in torch's CPU build (the same libgomp.so.1 torch loaded is reused).
FLAGS = ["-O3", "-march=native", "-fopenmp"]
_lock = threading.Lock()
_loaded: dict[str, bool] = {}


def sources_digest() -> str:
    """The kernels' sources and the headers they share, the flags and torch's version, hashed."""
    digest = hashlib.sha256()
    for source in sorted(Path(__file__).parent.glob("*.[ch]*")):
        digest.update(source.read_bytes())
    digest.update(" ".join(FLAGS + [torch.__version__]).encode())
    digest.update(b"sources staged in the folder")  # not the folders of older Kevs, which built from the checkout
    return digest.hexdigest()


def cpu_features() -> str:
    """What -march=native compiles for: the processor's feature flags (Linux), else its name. A kernel built on one
    CPU can hold instructions another lacks (SIGILL), so a cache shared between machines (a network home) must not
    hand one CPU's build to another."""
    try:
        with open("/proc/cpuinfo") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith(("flags", "Features"))),
                        platform.processor())
    except OSError:
        return platform.processor()


def build_dir(cache: Path) -> Path:
    """One folder per source set and processor."""
    cpu = hashlib.sha256(cpu_features().encode()).hexdigest()[:8]
    return cache / "kernels" / f"{sources_digest()[:16]}-{cpu}"


def kernels_label() -> str:
    """What the loaded kernels compute a row with, for the numerics fingerprint: their sources (a changed kernel
    may change bits) and the vector code -march=native chose on this CPU (AVX-512, AVX2 or scalar)."""
    return f"kev-cpu-{sources_digest()[:8]}-{torch.ops.kev.vector_isa()}"


def _staged_sources(folder: Path) -> list[str]:
    """The sources copied into the build folder (once: the folder is named by their contents), built from there.
    torch's build.ninja names each source by its path: two checkouts of the same sources (worktrees) building
    from their own paths rewrote it in turn, and each process then rebuilt every kernel (minutes per start)."""
    staged = folder / "src"
    staged.mkdir(exist_ok=True)
    for source in Path(__file__).parent.glob("*.[ch]*"):
        target, data = staged / source.name, source.read_bytes()
        if not target.exists() or target.read_bytes() != data:
            target.write_bytes(data)
    return [str(staged / source.name) for source in SOURCES]


def load_cpu_kernels(cache: Path) -> bool:
    """Build (first time) and load the kernels into torch.ops.kev; False when that fails."""
    with _lock:
        if "cpu" not in _loaded:
            _loaded["cpu"] = _build(build_dir(cache))
        return _loaded["cpu"]


@contextmanager
def _one_builder(folder: Path) -> Iterator[None]:
    """One process at a time builds or loads the kernels of a folder, under a lock that dies with its holder.
    torch's own `lock` file outlives a build that was killed, and every later load then waits on it forever:
    while holding ours, such a file can only be stale, so it goes."""
    with open(folder / "kev-build.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (folder / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(folder: Path) -> bool:
    from torch.utils.cpp_extension import load

    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _one_builder(folder):
            load(name="kev_kernels", sources=_staged_sources(folder), extra_cflags=FLAGS,
                 extra_ldflags=["-fopenmp"], build_directory=str(folder), is_python_module=False, verbose=False)
    except Exception as error:  # noqa: BLE001 - any build failure means: run on torch ops, loudly
        log.warning("Kev's C++ kernels could not be built (%s: %s); decode attention runs on torch SDPA",
                    type(error).__name__, str(error).splitlines()[0] if str(error) else "")
        return False
    return True
