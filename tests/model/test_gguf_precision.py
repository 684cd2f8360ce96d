"""core.precision gguf (the default GGUF's own Q4_1 / Q8_0 blocks) and w8a8 on the engine: the bytes held against
the file's, answers in strict equal to solo bit for bit, logits close to bf16's, the fingerprint names the format
and kernel path, and a Hugging Face folder under gguf is a config error."""
from __future__ import annotations

import pytest
import torch
from gguf import GGUFReader

import kev
from kev.engine.kv.memory_plan import inputs_for, make_plan, shape_of
from kev.errors import ConfigError
from kev.isolation.verify import VERIFY_QUESTIONS, VerifyOptions, run_verify
from kev.model.head_rescoring import RescoredHead
from kev.model.model_store import gguf_source, resolve_model_path
from kev.model.quant_weight import QuantWeight

SMALL = {"core": {"max_context": 256, "prefill_chunk": 32, "max_step_tokens": 128},
         "router": {"max_parallel_queries": 6, "channel_pool_size": 8, "default_timeout_ms": 600_000,
                    "strategy": "round_robin"}}
PROMPT = "The capital of France is Paris. The capital of Germany is"


def config(precision: str, **core: object) -> kev.KevConfig:
    return kev.load_config(SMALL, {"core": {"precision": precision, **core}})


@pytest.fixture(scope="module")
def engines():
    made = {p: kev.Engine(config(p), record_logits=True, background=False) for p in ("gguf", "w8a8", "bf16")}
    yield made
    for engine in made.values():
        engine.close()


def first_logits(engine: kev.Engine) -> tuple[torch.Tensor, list[int]]:
    [result] = engine.wait(engine.submit([PROMPT], max_tokens=1, temperature=0.0))
    return result.logits[0].float(), result.token_ids


def test_gguf_holds_the_files_blocks_in_about_the_files_bytes(engines):
    model = engines["gguf"].runner.model
    source = gguf_source("smollm2-135m-instruct")
    assert source is not None
    file_bytes = sum(int(t.n_bytes) for t in GGUFReader(source).tensors)
    assert model.weight_bytes() <= 1.1 * file_bytes
    held = {m.packed.type_name for m in model.modules() if isinstance(getattr(m, "packed", None), QuantWeight)}
    assert held == {"Q4_1", "Q8_0"}  # the layers' Q4_1 and the tied head's Q8_0, none dequantized
    assert model.fused_layers is not None  # every layer in one C++ call, as bf16's


@pytest.mark.parametrize("precision", ["gguf", "w8a8"])
def test_answers_in_strict_equal_solo_bit_for_bit(engines, precision):
    report = run_verify(engines[precision], VerifyOptions(VERIFY_QUESTIONS[:4], trials=2, max_tokens=4, seed=3))
    assert report.ok, report.to_dict()
    assert report.identical == report.comparisons and report.max_abs_logit_diff == 0.0


@pytest.mark.parametrize("precision", ["gguf", "w8a8"])
def test_logits_stay_close_to_bf16(engines, precision):
    """This prompt's top two tokens are 0.3 apart in fp32: int8 activations may swap them, not lose them. (w8a8's
    per-token activations alone lost bf16's top token here; SmoothQuant folded at load keeps it: model/smoothing.py.)"""
    a, _ = first_logits(engines[precision])
    b, b_ids = first_logits(engines["bf16"])
    assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.999
    assert b_ids[0] in a.topk(3).indices.tolist()


def test_fingerprint_names_the_formats_and_the_kernel_path(engines):
    fingerprints = {p: e.runner.fingerprint for p, e in engines.items()}
    assert len(set(fingerprints.values())) == 3
    assert engines["gguf"].runner.model.weight_numerics().startswith("torch.uint8+Q4_1,Q8_0@kev-quant-")
    w8a8 = engines["w8a8"].runner.model
    assert "~sq" in w8a8.weight_numerics()  # the smoothing's tag: folded weights' bits
    assert ("^head2" in w8a8.weight_numerics()) == (w8a8.rescored_head is not None)  # the two-pass head's logits


def test_w8a8_runs_the_two_pass_head_where_the_kernels_allow(engines):
    model = engines["w8a8"].runner.model
    if not RescoredHead.applies_to(model.head.packed):
        pytest.skip("the two-pass head needs Kev's AVX-512 BF16 GEMM and the w8a8 kernel's VNNI path")
    assert isinstance(model.rescored_head, RescoredHead)
    before = model.rescored_head.rescored_blocks
    first_logits(engines["w8a8"])
    assert 0 < model.rescored_head.rescored_blocks - before < model.head.out_features // 16  # some blocks, not all


def test_w8a8_holds_what_the_plan_says_the_two_pass_head_included(engines):
    engine = engines["w8a8"]
    model = engine.runner.model
    if model.rescored_head is None:
        pytest.skip("the two-pass head does not run here (the plan's figure is then an upper bound)")
    assert make_plan(inputs_for(engine.config, shape_of(model.config))).weights_bytes == model.weight_bytes()


def test_the_two_pass_head_calibrates_within_a_short_context():
    """The calibration text is longer than this max_context: its forward stops at the model's last position (past
    the rotary table it would read nothing real), and the head still recomputes a few blocks a row."""
    with kev.Engine(config("w8a8", max_context=256), record_logits=True, background=False) as engine:
        head = engine.runner.model.rescored_head
        if head is None:
            pytest.skip("the two-pass head does not run here")
        before = head.rescored_blocks
        first_logits(engine)
        assert 0 < head.rescored_blocks - before < 100


def test_rows_read_whole_take_the_plain_head_and_greedy_tokens_are_the_same(engines):
    """Greedy alone reads the argmax (the two-pass head's exact part); asking for logprobs reads the whole row, which
    the plain head gives: the same tokens either way, alone or side by side, and other logits."""
    engine = engines["w8a8"]
    if engine.runner.model.rescored_head is None:
        pytest.skip("the two-pass head does not run here")
    plain = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0.0}
    scored = {**plain, "logprobs": 1}
    alone = [engine.generate([q], timeout=600)[0] for q in (plain, scored)]
    together = engine.generate([plain, scored], timeout=600)
    assert alone[0].token_ids == alone[1].token_ids == together[0].token_ids == together[1].token_ids
    for one, both in zip(alone, together):
        assert torch.equal(one.logits, both.logits)
    assert not torch.equal(alone[0].logits, alone[1].logits)  # the argmax rows' tails are the first pass's
    assert torch.equal(alone[0].logits.amax(1), alone[1].logits.amax(1))  # their maxima the plain head's


def test_gguf_on_a_hugging_face_folder_is_a_config_error():
    folder = resolve_model_path("smollm2-135m-instruct")
    with pytest.raises(ConfigError, match="core.precision: gguf needs a .gguf model"):
        kev.Engine(config("gguf", model_path=str(folder)), background=False)
