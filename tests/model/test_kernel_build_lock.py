"""A build killed mid-way leaves torch's `lock` file in the kernels' folder; the next load must not wait on it."""
from __future__ import annotations

import pytest

from kev.model.cpu_kernels import _build, build_dir, load_cpu_kernels
from kev.model.model_store import cache_root


@pytest.mark.timeout(1200)  # without the fix this waits forever: fail instead
def test_a_stale_torch_build_lock_does_not_hang_the_next_load() -> None:
    if not load_cpu_kernels(cache_root()):
        pytest.skip("Kev's C++ kernels cannot be built here")
    folder = build_dir(cache_root())
    (folder / "lock").write_text("")  # what a SIGKILLed builder leaves behind
    assert _build(folder)
    assert not (folder / "lock").exists()


def test_each_processor_gets_its_own_kernel_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """-march=native code built on an AVX-512 CPU crashes an AVX2-only one: a shared cache keeps their builds apart."""
    import kev.model.cpu_kernels as kernels

    here = build_dir(cache_root())
    monkeypatch.setattr(kernels, "cpu_features", lambda: "fpu sse2 avx avx2 fma")
    other = build_dir(cache_root())
    assert here != other and here.parent == other.parent
    assert here.name.split("-")[0] == other.name.split("-")[0]  # the same sources
