"""OpenAI's Responses API on `kev serve` with the official client (plain, streamed, text.format, function tools,
previous_response_id, stored GET / DELETE) and openai-agents' default model class; every Response object and
stream event validates against OpenAI's published schemas, and the answer is the chat route's, to the bit."""
from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import openai
import pydantic
import pytest
from openai_schema import conforms

from kev.wire.responses.store import ResponseStore, Stored

pytestmark = pytest.mark.service
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}, "required": ["city"],
    "additionalProperties": False}}


@pytest.fixture(scope="module")
def model(openai_client: openai.OpenAI) -> str:
    return openai_client.models.list().data[0].id


def _dump(obj: Any) -> dict[str, Any]:
    return obj.model_dump(mode="json", exclude_unset=True)


def test_text_input_is_the_chat_answer_and_conforms(openai_client: openai.OpenAI, model: str) -> None:
    response = openai_client.responses.create(model=model, input="Name a colour.", instructions="Be brief.",
                                              max_output_tokens=12, temperature=0)
    conforms(_dump(response), "Response")
    chat = openai_client.chat.completions.create(
        model=model, max_tokens=12, temperature=0,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}])
    assert response.output_text == chat.choices[0].message.content
    assert response.usage is not None and response.usage.output_tokens == chat.usage.completion_tokens
    assert (response.status == "incomplete") == (chat.choices[0].finish_reason == "length")


def test_stream_events_conform_and_add_up_to_the_answer(openai_client: openai.OpenAI, model: str) -> None:
    kwargs: Any = dict(model=model, input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi!"}]}],
                       max_output_tokens=10, temperature=0.8, extra_body={"seed": 3})
    plain = openai_client.responses.create(**kwargs)
    events = list(openai_client.responses.create(**kwargs, stream=True))
    for event in events:
        conforms(_dump(event), "ResponseStreamEvent")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == plain.output_text == events[-1].response.output_text  # type: ignore[union-attr]


def test_text_format_json_schema_is_enforced(openai_client: openai.OpenAI, model: str) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}}, "required": ["name"],
              "additionalProperties": False}
    response = openai_client.responses.create(model=model, input="A person", max_output_tokens=40, temperature=0,
                                              text={"format": {"type": "json_schema", "name": "p", "schema": schema,
                                                               "strict": True}})
    assert set(json.loads(response.output_text)) == {"name"}


def test_function_call_then_its_output_through_previous_response_id(openai_client: openai.OpenAI,
                                                                    model: str) -> None:
    first = openai_client.responses.create(model=model, input="Weather in Paris?", tools=[WEATHER],
                                           tool_choice="required", max_output_tokens=40, temperature=0)
    conforms(_dump(first), "Response")
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Oslo")
    second = openai_client.responses.create(
        model=model, previous_response_id=first.id, tools=[WEATHER], max_output_tokens=8, temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
    conforms(_dump(second), "Response")
    assert second.previous_response_id == first.id and second.usage and first.usage
    assert second.usage.input_tokens > first.usage.input_tokens  # the first turn and the call are in its prompt
    assert openai_client.responses.retrieve(first.id).id == first.id
    openai_client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        openai_client.responses.create(model=model, input="x", previous_response_id=first.id)


def test_stored_responses_are_each_tenants_own() -> None:
    store = ResponseStore(capacity=2)
    store.put("a", Stored({"id": "resp_1"}, []))
    assert store.get("a", "resp_1") is not None and store.get("b", "resp_1") is None
    assert not store.delete("b", "resp_1") and store.get("a", "resp_1") is not None
    store.put("a", Stored({"id": "resp_2"}, []))
    store.put("a", Stored({"id": "resp_3"}, []))
    assert store.get("a", "resp_1") is None  # the oldest goes past capacity


def test_a_tenant_storing_many_responses_evicts_its_own_never_anothers() -> None:
    """Per tenant as retained results are (sharing.tenant_max_retained_results): each tenant its share, its own
    oldest going first past it; past the server's cap, the oldest of the tenant holding the most."""
    from kev.config.sharing_config import SharingConfig

    share = SharingConfig(weights={"a": 1, "b": 3})
    store = ResponseStore(capacity=8, tenant_capacity=lambda t: share.tenant_limit(None, 8, t, ["a", "b"]))
    for i in range(3):
        store.put("b", Stored({"id": f"b{i}"}, []))
    for i in range(10):  # a's share is 8 x 1/4 = 2
        store.put("a", Stored({"id": f"a{i}"}, []))
    assert [store.get("a", f"a{i}") is not None for i in range(10)] == [False] * 8 + [True] * 2
    assert all(store.get("b", f"b{i}") is not None for i in range(3))  # a never pushed out b's
    store.put("a", Stored({"id": "a9"}, []))  # storing an id again refreshes it, counts it once
    assert store.held("a") == 2 and store.held("b") == 3
    # Past the server's cap (tenants beyond the key list take the whole cap as share): the one holding the most
    # gives up its oldest.
    for i in range(5):
        store.put("c", Stored({"id": f"c{i}"}, []))
    assert store.held("a") + store.held("b") + store.held("c") == 8
    assert (store.held("a"), store.held("b"), store.held("c")) == (2, 3, 3)  # c came to hold the most: c's went
    assert store.get("c", "c1") is None and store.get("c", "c2") is not None
    store.put("b", Stored({"id": "b3"}, []))  # now b holds the most: b's oldest goes
    assert (store.held("a"), store.held("b"), store.held("c")) == (2, 3, 3) and store.get("b", "b0") is None
    assert store.delete("c", "c4") and not store.delete("c", "c4") and store.held("c") == 2


class Item(pydantic.BaseModel):
    # Bounded, as a real tool's arguments should be: the grammar (llguidance) enforces maxLength, minimum/maximum
    # and minItems/maxItems, so the forced call ends in a few dozen tokens; the 135M model, given an unbounded list
    # of unbounded strings, ran to max_output_tokens (openai-agents keeps these keywords in strict mode).
    sku: str = pydantic.Field(max_length=12)
    qty: int = pydantic.Field(ge=1, le=9)


def test_openai_agents_default_model_runs_a_tool_taking_a_list_of_models(openai_server: Any, model: str) -> None:
    import agents  # openai-agents (dev extra)
    seen: list[list[Item]] = []

    @agents.function_tool
    def order(items: Annotated[list[Item], pydantic.Field(min_length=1, max_length=3)]) -> str:
        """Order items."""
        seen.append(items)
        return f"ordered {len(items)} items"

    client = openai.AsyncOpenAI(base_url=f"{openai_server.url}/v1", api_key="sk-kev-test", max_retries=0, timeout=600)
    # The run ends with the tool's result (stop_on_first_tool): a free-text turn after it is the 135M model's to end,
    # and with bf16 activations (Zen 4) it ran to max_output_tokens, which the SDK raises on. That turn's wire
    # (function_call_output fed back) is test_function_call_then_its_output_through_previous_response_id's.
    agent = agents.Agent(name="shop", instructions="Order what the user asks for.", tools=[order],
                         tool_use_behavior="stop_on_first_tool",
                         model=agents.OpenAIResponsesModel(model=model, openai_client=client),
                         # one call: with parallel calls the forced grammar is an array of calls, which the model
                         # fills with copies of the same call up to max_tokens
                         model_settings=agents.ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                                             max_tokens=400, temperature=0))
    result = asyncio.run(agents.Runner.run(agent, "Order two apples.", max_turns=4))
    assert len(seen) == 1 and seen[0] and all(isinstance(item, Item) for item in seen[0])  # validated nested models
    assert all(len(item.sku) <= 12 and 1 <= item.qty <= 9 for item in seen[0]) and len(seen[0]) <= 3
    outputs = [item for item in result.new_items if item.type == "tool_call_output_item"]
    assert len(outputs) == 1 and outputs[0].output == f"ordered {len(seen[0])} items"
    assert len(result.raw_responses) == 1 and result.final_output == outputs[0].output
