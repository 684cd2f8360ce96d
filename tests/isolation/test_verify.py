"""kev verify: passes on strict, and fails loudly on an injected difference or an injected canary leak."""
from __future__ import annotations

import importlib.util
import json

import pytest

import kev
from kev.cli.main import main
from kev.errors import ConfigError
from kev.isolation import verify
from kev.isolation.verify import DEFAULT_SYSTEM, VERIFY_QUESTIONS, VerifyOptions, run_verify

SMALL = {"core": {"max_context": 256, "prefill_chunk": 32, "max_step_tokens": 128},
         "router": {"max_parallel_queries": 8, "channel_pool_size": 12}}
# The near-duplicates, the shortest and the longest built-in question.
QUESTIONS = [VERIFY_QUESTIONS[0], VERIFY_QUESTIONS[1], "Hi", max(VERIFY_QUESTIONS, key=len)]


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine(SMALL, record_logits=True, background=False)


def test_strict_mixes_equal_solo(engine):
    progress = []
    report = run_verify(engine, VerifyOptions(QUESTIONS, trials=2, max_tokens=4, seed=1),
                        lambda label, done, total: progress.append((label, done, total)))
    assert report.ok, report.to_dict()
    # kev verify's progress bar: one tick before each solo reference (questions + canary) and each mix
    assert [done for _, done, _ in progress] == list(range(len(QUESTIONS) + 1 + 2))
    assert {total for _, _, total in progress} == {len(QUESTIONS) + 1 + 2} and progress[-1][0] == "packed mix 2/2"
    assert report.identical == report.comparisons == 2 * len(QUESTIONS)
    assert report.max_abs_logit_diff == 0.0 and not report.leaks
    assert report.canary_check.identical == 1
    assert report.numerics_fingerprint == engine.runner.fingerprint
    assert len(set().union(*(c.channels for c in report.checks))) > len(QUESTIONS), "questions moved between channels"


def test_an_injected_logit_difference_fails(engine, monkeypatch):
    real, calls = verify.run_mix, []

    def perturbed(engine, items, rng, options, drafts=False):
        results = real(engine, items, rng, options, drafts)
        calls.append(len(items))
        if len(calls) == len(QUESTIONS[:2]) + 2:  # the first mix, after the solo runs (2 questions + canary)
            target = next(r for r, item in zip(results, items) if item.text in QUESTIONS[:2])
            target.logits = target.logits.clone()
            target.logits[-1, 7] += 1e-4  # a tiny change the argmax does not see
        return results

    monkeypatch.setattr(verify, "run_mix", perturbed)
    report = run_verify(engine, VerifyOptions(QUESTIONS[:2], trials=1, max_tokens=3, seed=2))
    assert not report.ok
    assert report.identical == report.comparisons - 1
    assert 0 < report.max_abs_logit_diff < 1e-3
    assert any("logits differ" in p for c in report.checks for p in c.problems)


def test_an_injected_canary_leak_is_caught(engine, monkeypatch):
    real = verify.run_mix

    def leaky(engine, items, rng, options, drafts=False):
        results = real(engine, items, rng, options, drafts)
        canary = next((i.text for i in items if i.text.startswith("Remember the code word")), None)
        if canary and len(items) > 1:
            victim = next(r for r, item in zip(results, items) if item.text != canary)
            victim.text += " the code word is " + canary.split()[4].rstrip(".")
        return results

    monkeypatch.setattr(verify, "run_mix", leaky)
    report = run_verify(engine, VerifyOptions(QUESTIONS[:2], trials=1, max_tokens=3, seed=3))
    assert len(report.leaks) == 1 and not report.ok
    assert report.to_dict()["canary_leaks"] == 1


def test_verify_needs_a_logits_engine(make_engine):
    with pytest.raises(ValueError, match="record_logits"):
        run_verify(make_engine(SMALL, background=False), VerifyOptions(QUESTIONS[:1], trials=1, max_tokens=2))


def test_cli_json_and_exit_code(tmp_path, capsys):
    questions = tmp_path / "q.txt"
    questions.write_text("# two questions\n解释一下注意力机制\n\nHi\n", encoding="utf-8")
    config = tmp_path / "kev.yaml"
    config.write_text(json.dumps({"kev": SMALL}), encoding="utf-8")  # JSON is YAML
    code = main(["verify", "--config", str(config), "--questions", str(questions), "--trials", "1",
                 "--max-tokens", "3", "--seed", "4", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert (out["questions"], out["trials"], out["identical"], out["canary_leaks"]) == (2, 1, 2, 0)
    assert out["level"] == "strict" and out["max_abs_logit_diff"] == 0.0 and len(out["numerics_fingerprint"]) == 12


def level_available(level: str) -> bool:
    """Looser levels switch on once the engine has its prefix store and the config accepts them."""
    if importlib.util.find_spec("kev.engine.kv.prefix_store") is None:
        return False
    overrides = {"level": level, "kv_cache": "shared_readonly"}
    if level == "loose":
        overrides["system_prompt"] = DEFAULT_SYSTEM
    try:
        kev.load_config({"isolation": overrides})
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("level", ["shared", "loose"])
def test_looser_levels_equal_solo(make_engine, level):
    if not level_available(level):
        pytest.skip(f"the engine does not run isolation level {level!r} yet")
    iso = {"level": level, "kv_cache": "shared_readonly"}
    if level == "loose":
        iso["system_prompt"] = DEFAULT_SYSTEM
    engine = make_engine({**SMALL, "isolation": iso}, record_logits=True, background=False)
    system = DEFAULT_SYSTEM if level == "shared" else None  # loose: the config's declared prompt
    report = run_verify(engine, VerifyOptions(QUESTIONS, trials=2, max_tokens=4, level=level, system=system, seed=5))
    assert report.ok, report.to_dict()
