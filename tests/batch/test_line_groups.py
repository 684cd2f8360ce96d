"""Batch lines sharing a long prompt start go to the engine as one request (the start computed once); each line
still gets its own record, answered as the line alone would be."""
from __future__ import annotations

import asyncio

import pytest

import kev
from kev.batch.input_file import BatchLine
from kev.batch.line_groups import group_lines
from kev.batch.requests import RequestBuilder
from kev.batch.runner import BatchRunner
from kev.bench.documents import make_document
from kev.backend.bridge import EngineBridge
from kev.backend.metrics import ServerMetrics

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def engine_config():
    return kev.load_config({"server": {"model_name": MODEL}})


def lines_for(questions: list[str], max_tokens: int = 4) -> list[BatchLine]:
    return [BatchLine(i + 1, f"req-{i}", "/v1/chat/completions",
                      {"model": MODEL, "messages": [{"role": "user", "content": q}], "max_tokens": max_tokens,
                       "temperature": 0})
            for i, q in enumerate(questions)]


def test_lines_group_by_shared_start_and_equal_options(engine_config):
    builder = RequestBuilder.from_config(engine_config)
    doc_a, doc_b = "A" * 600, "B" * 600
    questions = [doc_a + " task 1", "Hi", doc_b + " task 1", doc_a + " task 2", doc_b + " task 2", doc_a + " t3"]
    requests = [builder.build(line) for line in lines_for(questions)]
    requests[5] = builder.build(lines_for(questions, max_tokens=7)[5])  # other options: not the same request
    groups = group_lines(requests)
    assert [[position for position, _ in g] for g in groups] == [[0, 3], [1], [2, 4], [5]]


def test_a_batch_of_documents_times_tasks_answers_each_line_as_alone(make_engine, engine_config):
    engine = make_engine({"router": {"max_parallel_queries": 8, "channel_pool_size": 16}})
    count = lambda text: len(engine.tokenizer.encode(text))  # noqa: E731
    docs = [make_document(i, "en" if i == 0 else "zh", 400, count) for i in range(2)]
    questions = [d.question(t) for t in range(3) for d in docs] + ["What is 2+2?"]
    builder = RequestBuilder.from_config(engine_config)
    requests = [builder.build(line) for line in lines_for(questions)]
    assert len(group_lines(requests)) == 3
    records: dict[str, dict] = {}

    async def run() -> bool:
        bridge = EngineBridge(engine, ServerMetrics(), 4)
        runner = BatchRunner(bridge, MODEL, max_inflight=16)
        return await runner.run(requests, lambda r, rec: records.__setitem__(r.custom_id, rec), asyncio.Event())

    before = engine.stats.num_prefix_tokens_computed
    assert asyncio.run(run())
    assert engine.stats.num_prefix_tokens_computed - before > sum(count(d.text) for d in docs) * 0.9
    ids = set()
    for i, question in enumerate(questions):
        record = records[f"req-{i}"]
        assert record["response"]["status_code"] == 200, record
        alone = engine.generate([{"messages": [{"role": "user", "content": question}]}], max_tokens=4,
                                timeout=600)[0]
        assert record["response"]["body"]["choices"][0]["message"]["content"] == alone.text, question[-40:]
        ids.add(record["response"]["body"]["id"])
    assert len(ids) == len(questions), "each line its own response id"
