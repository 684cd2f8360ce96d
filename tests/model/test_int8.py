"""core.precision int8 (weight-only, per output channel): what it holds, how close it stays to bf16, the cache of
quantized weights, and batch invariance exactly as in bf16."""
from __future__ import annotations

import json
import logging

import pytest
import torch

import kev
from kev.cli.main import main
from kev.engine.engine_setup import build_parts
from kev.engine.kv.memory_plan import inputs_for, make_plan, shape_of
from kev.isolation.verify import VERIFY_QUESTIONS, VerifyOptions, run_verify
from kev.model import cache_manifest, weights
from kev.model.linear import GemmWeight, Linear
from kev.model.model_store import resolve_model_path
from kev.model.quantize import quantize_rows

SMALL = {"core": {"max_context": 256, "prefill_chunk": 32, "max_step_tokens": 128},
         "router": {"max_parallel_queries": 6, "channel_pool_size": 8, "default_timeout_ms": 600_000,
                    "strategy": "round_robin"}}


def config(precision: str, **core: object) -> kev.KevConfig:
    return kev.load_config(SMALL, {"core": {"precision": precision, **core}})


@pytest.fixture(scope="module")
def int8_engine():
    engine = kev.Engine(config("int8"), record_logits=True, background=False)
    yield engine
    engine.close()


def test_quantize_rows_is_symmetric_per_row():
    weight = torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [3.0, 1.5, -3.0]])
    q, scale = quantize_rows(weight)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert q.abs().amax(1).tolist() == [127, 0, 127]
    assert torch.allclose(q.float() * scale[:, None], weight, atol=float(scale.max()) / 2)


def test_int8_holds_what_the_plan_says_and_about_half_of_bf16(int8_engine):
    model = int8_engine.runner.model
    # activations and K/V: bf16 where the CPU has it natively, else fp32 (kev/config/precision.py)
    value_bytes = 2 if int8_engine.config.core.activation_precision == "bf16" else 4
    assert model.dtype == (torch.bfloat16 if value_bytes == 2 else torch.float32)
    assert int8_engine.runner.kv_bytes_per_token == 2 * 30 * 3 * 64 * value_bytes
    plan = make_plan(inputs_for(int8_engine.config, shape_of(model.config)))
    assert plan.weights_bytes == model.weight_bytes()
    bf16_plan = make_plan(inputs_for(config("bf16"), shape_of(model.config)))
    assert model.weight_bytes() <= 0.55 * bf16_plan.weights_bytes
    packed = [m.packed for m in model.modules() if isinstance(getattr(m, "packed", None), GemmWeight)]
    if torch.ops.kev.linear_available():  # Kev's GEMM (AVX-512, or AVX2): it holds the int8 weights, packed
        assert packed and all(p.packed.dtype == torch.int8 for p in packed)
    else:  # no kernels built: the int8 weights stay as they are, multiplied over fixed tiles
        quantized = [m for m in model.modules() if isinstance(m, Linear) and m.scale is not None]
        assert not packed and quantized and all(m.weight.dtype == torch.int8 for m in quantized)


def test_int8_answers_in_strict_equal_solo_bit_for_bit(int8_engine):
    report = run_verify(int8_engine, VerifyOptions(VERIFY_QUESTIONS[:4], trials=2, max_tokens=4, seed=3))
    assert report.ok, report.to_dict()
    assert report.identical == report.comparisons and report.max_abs_logit_diff == 0.0


def test_int8_logits_stay_close_to_bf16(int8_engine):
    prompt = "The capital of France is Paris. The capital of Germany is"
    int8_ids = int8_engine.submit([prompt], max_tokens=1, temperature=0.0)
    [int8_result] = int8_engine.wait(int8_ids)
    bf16 = kev.Engine(config("bf16"), record_logits=True, background=False)
    try:
        [bf16_result] = bf16.wait(bf16.submit([prompt], max_tokens=1, temperature=0.0))
    finally:
        bf16.close()
    a, b = int8_result.logits[0].float(), bf16_result.logits[0].float()
    assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.99
    assert int8_result.token_ids == bf16_result.token_ids


def test_torch_ops_path_matches_kevs_kernel_closely(int8_engine):
    """core.kernels torch (CUDA's route too): int8 widened by torch, the scale after the sum."""
    model = int8_engine.runner.model
    engine = kev.Engine(config("int8", kernels="torch"), build_parts(config("int8", kernels="torch"), model,
                                                                      int8_engine.tokenizer), record_logits=True,
                        background=False)
    prompt = "Name three colours."
    try:
        [torch_result] = engine.wait(engine.submit([prompt], max_tokens=3, temperature=0.0))
    finally:
        engine.close()
        build_parts(int8_engine.config, model, int8_engine.tokenizer)  # Kev's kernels back for the module engine
    [kev_result] = int8_engine.wait(int8_engine.submit([prompt], max_tokens=3, temperature=0.0))
    a, b = torch_result.logits[0].float(), kev_result.logits[0].float()
    assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.999


def test_quantized_weights_are_cached_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setattr(weights, "cache_root", lambda: tmp_path)
    folder = resolve_model_path("smollm2-135m-instruct")
    first = weights.load_model(folder, "int8", torch.device("cpu"), 64)
    [cached] = (tmp_path / "int8").glob("*.safetensors")
    monkeypatch.setattr(weights, "quantize_state", lambda *_: pytest.fail("quantized again despite the cache"))
    second = weights.load_model(folder, "int8", torch.device("cpu"), 64)
    for a, b in zip(first.state_dict().values(), second.state_dict().values()):
        assert torch.equal(a, b)
    assert torch.equal(first.embed_tokens.scale, second.embed_tokens.scale)
    assert cached.stat().st_size < 0.55 * 2 * first.config.num_params


def test_plan_cli_agrees_with_the_engine(int8_engine, capsys):
    main(["plan", "--precision", "int8", "--json"])
    assert json.loads(capsys.readouterr().out)["weights_bytes"] == int8_engine.runner.model.weight_bytes()


@pytest.mark.parametrize("damage", ["bit-flip", "no-manifest"])
def test_a_damaged_int8_cache_is_quantized_again_with_one_line(tmp_path, monkeypatch, caplog, damage):
    """The int8 cache has a manifest as the converted model cache does (kev/model/cache_manifest.py): a flipped bit in
    its tensor data, or a file without a manifest (an older Kev's, an interrupted write), is never loaded."""
    from tests.model.test_model_cache import flip_a_bit_in_tensor_data

    monkeypatch.setattr(weights, "cache_root", lambda: tmp_path)
    monkeypatch.delenv("KEV_CACHE_VERIFY", raising=False)
    folder = resolve_model_path("smollm2-135m-instruct")
    first = weights.load_model(folder, "int8", torch.device("cpu"), 64)
    [cached] = (tmp_path / "int8").glob("*.safetensors")
    manifest = cached.parent / cache_manifest.file_manifest(cached)
    assert cache_manifest.find_damage(cached.parent, manifest=manifest.name) is None
    if damage == "bit-flip":
        flip_a_bit_in_tensor_data(cached)
    else:
        manifest.unlink()
    quantized = []
    real = weights.quantize_state
    monkeypatch.setattr(weights, "quantize_state", lambda *args: quantized.append(1) or real(*args))
    with caplog.at_level(logging.WARNING, logger="kev.model.quantize"):
        second = weights.load_model(folder, "int8", torch.device("cpu"), 64)
    [line] = [r.getMessage() for r in caplog.records]
    why = "content does not match" if damage == "bit-flip" else "has no"
    assert str(cached) in line and why in line and "quantizing the weights again" in line, line
    assert quantized == [1]
    for a, b in zip(first.state_dict().values(), second.state_dict().values()):
        assert torch.equal(a, b)
    assert cache_manifest.find_damage(cached.parent, manifest=manifest.name) is None  # rewritten, manifest last
    monkeypatch.setattr(weights, "quantize_state", lambda *_: pytest.fail("quantized again despite the cache"))
    weights.load_model(folder, "int8", torch.device("cpu"), 64)
