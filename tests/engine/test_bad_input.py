"""Bad input gets a clear error naming the field or value, and harms no other question."""
from __future__ import annotations

import pytest

import kev
from kev.model.model_store import ModelNotFoundError


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine({"core": {"max_context": 96}})


def test_bad_questions_fail_alone(engine):
    long_text = "word " * 200
    results = engine.generate(["", 123, "Hi", long_text, {"text": "Hi", "max_tokens": 0}, {"txt": "x"},
                               [{"role": "wizard", "content": "x"}]], max_tokens=4, timeout=300)
    by_index = {r.index: r for r in results}
    assert by_index[2].status == "ok" and by_index[2].completion_tokens == 4
    expectations = {0: "queries[0]: is empty", 1: "queries[1]: must be a string", 3: "core.max_context is 96",
                    4: "queries[4].max_tokens", 5: "unknown field(s) ['txt']", 6: "queries[6][0].role"}
    for index, fragment in expectations.items():
        assert by_index[index].status == "error"
        assert fragment in by_index[index].error, by_index[index].error


@pytest.mark.parametrize("kwargs,fragment", [
    ({"max_tokens": 0}, "max_tokens: must be >= 1"),
    ({"max_tokens": 10**9}, "max_tokens_cap"),
    ({"temperature": -1}, "temperature"),
    ({"isolation": "paranoid"}, "isolation: unknown level 'paranoid'"),
    ({"max_parallel": 0}, "max_parallel"),
    ({"stop": [""]}, "stop"),
])
def test_bad_request_arguments_raise(engine, kwargs, fragment):
    with pytest.raises(kev.InvalidRequestError, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        engine.submit(["Hi"], **kwargs)


def test_empty_request_raises(engine):
    with pytest.raises(kev.InvalidRequestError, match="queries"):
        engine.submit([])


def test_unknown_request_id(engine):
    with pytest.raises(kev.UnknownRequestError, match="nope"):
        engine.wait("nope")


@pytest.mark.parametrize("config,fragment", [
    ({"core": {"max_contxt": 5}}, "unknown config key 'kev.core.max_contxt'"),
    ({"routr": {}}, "unknown config key 'kev.routr'"),
    ({"core": {"precision": "fp8"}}, "kev.core.precision"),
    ({"router": {"channel_pool_size": 2, "max_parallel_queries": 8}}, "router.channel_pool_size (2)"),
])
def test_config_errors_name_the_key(config, fragment):
    with pytest.raises(kev.ConfigError) as err:
        kev.load_config(config)
    assert fragment in str(err.value)


def test_empty_config_file_works(tmp_path):
    path = tmp_path / "kev.yaml"
    path.write_text("")
    assert kev.load_config(path).core.model_path == "smollm2-135m-instruct"
    path.write_text("kev:\n")
    assert kev.load_config(path).isolation.level == "strict"


def test_unknown_model_path_names_it():
    with pytest.raises(ModelNotFoundError, match="/no/such/model"):
        kev.Engine.from_config({"core": {"model_path": "/no/such/model"}})


def test_edge_values_are_clean_errors_or_work(engine):
    results = engine.generate(["\ud800 broken", {"text": "Hi", "seed": 2**63}, {"text": "Hi", "temperature": 1e-30}],
                              max_tokens=2, timeout=300)
    assert results[0].status == "error" and "lone surrogate" in results[0].error
    assert results[1].status == "error" and "seed" in results[1].error
    assert results[2].status == "ok", "a tiny temperature is greedy, not NaN"


def test_close_cancels_unfinished_questions(make_engine):
    engine = make_engine(background=False)
    rid = engine.submit(["Hi", "Tell me a long story."], max_tokens=50)
    engine.step()
    engine.close()
    assert {r.status for r in engine.results(rid)} == {"cancelled"}
    assert len(list(engine.stream(rid, timeout=5))) >= 2, "a stream of a closed engine ends"
