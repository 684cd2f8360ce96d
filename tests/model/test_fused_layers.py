"""All decoder layers in one C++ call (kev/model/fused_layers.py) give the Python layer loop's bits."""
from __future__ import annotations

import pytest
import torch

import kev
from tests.model.fused_steps import counting_fused_steps

QUESTIONS = ["Hi", "What is the capital of France? Answer in one word.", "写出一个Python快速排序示例",
             "List three prime numbers."]


def answers(engine: kev.Engine) -> list[kev.Result]:
    return engine.generate(QUESTIONS, max_tokens=6, timeout=300)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fused_layers_match_the_layer_loop(make_engine, precision):
    if precision == "fp32":
        engine = make_engine(record_logits=True, background=False)
    else:
        engine = kev.Engine.from_config({"core": {"precision": "bf16"}, "router": {"strategy": "round_robin"},
                                         "aggregator": {"timeout_ms": 600_000}}, record_logits=True, background=False)
    model = engine.runner.model
    fused = model.fused_layers
    if fused is None:
        pytest.skip("Kev's GEMM is not available on this CPU: the layer loop is the only path")
    with counting_fused_steps() as used:
        with_op = answers(engine)
    assert any(used), "no step ran the fused op"
    model.fused_layers = None
    try:
        loop = answers(engine)
    finally:
        model.fused_layers = fused
        if precision == "bf16":
            engine.close()
    for a, b in zip(with_op, loop):
        assert a.token_ids == b.token_ids
        assert torch.equal(a.logits, b.logits)
