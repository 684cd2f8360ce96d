"""core.precision auto: a .gguf model runs its own blocks on a CPU; a Hugging Face folder runs bf16 where the CPU
computes it natively, fp32 elsewhere; explicit values stand. Quantized weights compute in bf16 where native, else
fp32."""
from __future__ import annotations

import pytest

import kev
from kev.config import precision


@pytest.fixture
def cpu_flags(monkeypatch):
    """cpu_flags(flags): the CPU's native bf16 flags as given (pick_precision's cache cleared around it)."""
    def set_flags(flags: tuple[str, ...]) -> None:
        precision.pick_precision.cache_clear()
        monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: flags)

    yield set_flags
    precision.pick_precision.cache_clear()


def core(**fields):
    return kev.load_config({"core": {"device": "cpu", **fields}}).core


def test_explicit_precision_is_kept(cpu_flags):
    cpu_flags(("avx512_bf16",))
    assert core(precision="fp32").resolved_precision == "fp32"
    assert core(precision="bf16", model_path="/models/x.gguf").resolved_precision == "bf16"


def test_a_gguf_model_runs_its_own_blocks(cpu_flags, tmp_path):
    for flags in [("avx512_bf16",), ()]:
        cpu_flags(flags)
        assert core().resolved_precision == "gguf"  # the default model is an alias for a .gguf file
        assert core(model_path=str(tmp_path / "m.Q4_0.GGUF")).resolved_precision == "gguf"
        assert "a .gguf model runs its own blocks" in precision.describe("auto", "cpu", "smollm2-135m-instruct")


def test_tensor_parallel_keeps_floats_for_a_gguf(cpu_flags):
    cpu_flags(())
    assert core(tensor_parallel=2).resolved_precision == "fp32"
    assert "tensor_parallel splits float or int8 weights only" in core(tensor_parallel=2).precision_choice


def test_torch_kernels_keep_floats_for_a_gguf(cpu_flags):
    cpu_flags(())
    assert core(kernels="torch").resolved_precision == "fp32"
    assert "the blocks need Kev's CPU kernels" in core(kernels="torch").precision_choice


def test_a_folder_follows_the_cpu_flags(cpu_flags, tmp_path):
    cpu_flags(("avx512_bf16",))
    assert core(model_path=str(tmp_path)).resolved_precision == "bf16"
    cpu_flags(())
    assert core(model_path=str(tmp_path)).resolved_precision == "fp32"
    assert "no native bf16" in precision.describe("auto", "cpu", str(tmp_path))


def test_quantized_weights_compute_in_bf16_only_where_the_cpu_has_it(cpu_flags):
    cpu_flags(("amx_bf16",))
    assert [core(precision=p).activation_precision for p in ("gguf", "w8a8", "int8", "fp32")] == \
        ["bf16", "bf16", "bf16", "fp32"]
    cpu_flags(())
    assert [core(precision=p).activation_precision for p in ("gguf", "w8a8", "int8", "bf16")] == \
        ["fp32", "fp32", "fp32", "bf16"]
    assert "activations fp32" in precision.describe("auto", "cpu", "smollm2-135m-instruct")


def test_auto_is_the_default():
    assert kev.load_config({}).core.precision == "auto"
