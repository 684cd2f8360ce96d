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
