"""The server's limits (config `server:`), written into the published OpenAPI schema where a JSON Schema keyword
can say them, so a request the schema accepts is one the server accepts (issue 24, point 5).

The request models hold the limits that never change; these depend on the config: questions per request,
characters per question, the max_tokens cap, the timeout cap. What no keyword can say (a sum of
characters over several messages, prompts x n) stays the server's own check, a 413. Two pairs the schema could
say only as one if/then per value, which schemathesis cannot generate from (best_of against n, logprobs with tools
while streaming), are a 400: a combination Kev does not serve, as grammar that does not compile is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kev.config.schema import ISOLATION_ORDER
from kev.model.model_config import ModelConfig
from kev.model.model_store import resolve_model_path
from kev.model.tokenizer import Tokenizer
from kev.wire.bodies.api_models import MAX_SEED, MIN_TEMPERATURE
from kev.wire.limits import Limits
from kev.wire.bodies.openai_models import UNSUPPORTED

_TEXT_FIELDS = ("text", "prompt", "system", "content")


# Rules that join two fields, as JSON Schema's if/then: max_tokens 0 only to score the prompt. (Not on a Kev API
# question object: one bad question is that question's error result in a 200, never the request's 4xx.)
_SCORING_ONLY = {"QueryBody": "prompt_logprobs", "SubmitBody": "prompt_logprobs", "CompletionBody": "echo"}
_ONE_OF = {"TokenizeBody": ("prompt", "messages")}  # exactly one of these keys
# logit_bias keys are token ids; on a Kev API question object a bad key is that question's error result instead.
_TOKEN_ID_KEYS = ("QueryBody", "SubmitBody", "ChatCompletionBody", "CompletionBody")
_STRUCTURE_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                     "guided_grammar")
# The chat route refuses a chat whose every message is blank: one must hold a non-space character (a text part too).
_SPOKEN = {"type": "string", "pattern": "\\S"}
_SOME_MESSAGE_SAYS_SOMETHING = {"properties": {"content": {"anyOf": [
    _SPOKEN, {"type": "array", "contains": {"properties": {"text": _SPOKEN}}}]}}}
# An OpenAI message has content (not null) unless it is an assistant turn that made tool calls.
_HAS_CONTENT = {"anyOf": [
    {"required": ["content"], "properties": {"content": {"not": {"type": "null"}}}},
    {"required": ["role", "tool_calls"],
     "properties": {"role": {"const": "assistant"}, "tool_calls": {"type": "array", "minItems": 1}}}]}
_JSON_SCHEMA_FORMAT_HAS_SCHEMA = {
    "if": {"required": ["type"], "properties": {"type": {"const": "json_schema"}}},
    "then": {"required": ["json_schema"], "properties": {"json_schema": {
        "type": "object", "required": ["schema"], "properties": {"schema": {"type": "object"}}}}}}
# A structured-output field left unset: absent (no `required`), null, or for response_format an object whose type is
# "text". Said positively (no `not`): schemathesis gives up on a body whose `not`s multiply past its limit (the chat
# body's 15 pairwise "not both" rules and 6 under the forced call did).
_NO_STRUCTURE = {"response_format": {"anyOf": [{"type": "null"},
                                               {"type": "object", "properties": {"type": {"const": "text"}}}]}}


def _unset(field: str) -> dict[str, Any]:
    return _NO_STRUCTURE.get(field, {"type": "null"})


@dataclass(frozen=True)
class Vocab:
    """Token ids the served model takes (prompts, logit_bias keys) and the ids its tokenizer can decode."""

    model: int
    tokenizer: int


def served_vocab(model_path: str, tokenizer: Tokenizer) -> Vocab:
    """The engine checks ids against the model's embedding rows; /detokenize against what the tokenizer knows."""
    return Vocab(ModelConfig.from_folder(resolve_model_path(model_path)).vocab_size, tokenizer.vocab_size)


def apply_limits(schema: dict[str, Any], limits: Limits, isolation_cap: str, vocab: Vocab | None = None) -> None:
    """Tighten the request bodies (never a response) of a generated OpenAPI schema, in place; token ids are bounded
    once the model is known (vocab)."""
    schemas = schema["components"]["schemas"]
    levels = [level for level, rank in ISOLATION_ORDER.items() if rank <= ISOLATION_ORDER[isolation_cap]]
    for name in _request_components(schema):
        body = schemas[name]
        _bound_body(body, limits)
        for branch in body.get("properties", {}).get("isolation", {}).get("anyOf", []):
            if "enum" in branch:  # no looser than the configured isolation.level
                branch["enum"] = [level for level in branch["enum"] if level in levels]
        rules = _joint_rules(name, body.get("properties", {}))
        if rules:
            body["allOf"] = rules
        if name in _TOKEN_ID_KEYS and "logit_bias" in body.get("properties", {}):
            for branch in body["properties"]["logit_bias"].get("anyOf", [body["properties"]["logit_bias"]]):
                if branch.get("type") == "object":
                    branch["propertyNames"] = {"pattern": "^[0-9]+$"}  # token ids
        if name == "CompletionBody":
            _bound_completion_prompt(body["properties"]["prompt"], limits)
        if name == "ChatCompletionBody":  # the Kev API answers a blank chat with that question's error result
            body["properties"]["messages"]["contains"] = _SOME_MESSAGE_SAYS_SOMETHING
        if name == "ResponseFormat":  # type json_schema carries its schema
            body["allOf"] = [*body.get("allOf", []), _JSON_SCHEMA_FORMAT_HAS_SCHEMA]
        if name == "OpenAIMessage":
            body["allOf"] = [*body.get("allOf", []), _HAS_CONTENT]
        if vocab is not None:
            _bound_token_ids(name, body, vocab)
        if name in ("ChatCompletionBody", "CompletionBody"):  # refused by name unless at their no-op value
            for field, allowed in UNSUPPORTED.items():
                body["properties"].setdefault(field, {"enum": list(allowed),
                                                      "description": "not supported by Kev: only this no-op value"})
        if name == "StructuredOutputs":  # exactly one kind of constraint (its keys are the five kinds)
            body["minProperties"] = body["maxProperties"] = 1
        if name in _ONE_OF:  # one of them set (not null), the other absent or null
            body["oneOf"] = [{"required": [key], "properties": {k: {"type": "null"} for k in _ONE_OF[name] if k != key}
                              | {key: {"not": {"type": "null"}}}} for key in _ONE_OF[name]]


def _joint_rules(name: str, properties: dict[str, Any]) -> list[dict[str, Any]]:
    """What the route checks across fields, as JSON Schema: if/then, and at most one of a set."""
    rules: list[dict[str, Any]] = []
    if name in _SCORING_ONLY:  # max_tokens 0 only to score the prompt
        scoring = _SCORING_ONLY[name]
        rules.append({"if": {"properties": {"max_tokens": {"const": 0}}, "required": ["max_tokens"]},
                      "then": {"properties": {scoring: {"const": True}}, "required": [scoring]}})
    if "top_logprobs" in properties:  # needs logprobs: true
        rules.append({"if": {"properties": {"top_logprobs": {"not": {"type": "null"}}}, "required": ["top_logprobs"]},
                      "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]}})
    present = [field for field in _STRUCTURE_FIELDS if field in properties]
    if "tool_choice" in properties:
        rules += _tool_rules(present)
    if "echo" in properties:  # the prompt in the text is not streamed
        rules.append({"not": {"required": ["echo", "stream"], "properties": {"echo": {"const": True},
                                                                              "stream": {"const": True}}}})
    if len(present) > 1:  # at most one structured-output field set: all unset, or all but one
        rules.append({"anyOf": [{"properties": {field: _unset(field) for field in present if field != chosen}}
                                for chosen in [None, *present]]})
    return rules


def _tool_rules(structure_fields: list[str]) -> list[dict[str, Any]]:
    """tool_choice auto, required or a function needs tools; a forced call (required or a function) has its own
    grammar, so no structured-output field beside it."""
    forced = {"required": ["tool_choice"], "properties": {"tool_choice": {"anyOf": [
        {"const": "required"}, {"type": "object"}]}}}
    no_structure = {"properties": {field: _unset(field) for field in structure_fields}}
    return [
        {"if": {"required": ["tool_choice"], "properties": {"tool_choice": {"anyOf": [
            {"enum": ["auto", "required"]}, {"type": "object"}]}}},
         "then": {"required": ["tools"], "properties": {"tools": {"type": "array", "minItems": 1}}}},
        {"if": forced, "then": no_structure}]


def _bound_token_ids(name: str, body: dict[str, Any], vocab: Vocab) -> None:
    """Token ids the OpenAI routes and /detokenize refuse with a 400 (the Kev API answers an id outside the
    vocabulary with that question's error result, so its ids stay unbounded)."""
    properties = body.get("properties", {})
    if name == "DetokenizeBody":
        _bound(properties["tokens"].get("items"), "integer", maximum=vocab.tokenizer - 1)
    if name == "CompletionBody":  # a list of ids, or a list of lists of them
        for branch in properties["prompt"].get("anyOf", []):
            items = branch.get("items", {})
            _bound(items, "integer", maximum=vocab.model - 1)
            _bound(items.get("items"), "integer", maximum=vocab.model - 1)
    if name in ("ChatCompletionBody", "CompletionBody"):
        for branch in properties["logit_bias"].get("anyOf", []):
            if branch.get("type") == "object":
                branch["propertyNames"] = {"pattern": decimal_at_most(vocab.model - 1)}


def decimal_at_most(top: int) -> str:
    """A regex for the decimal numbers 0..top in ASCII digits, leading zeros allowed (as int() reads a key)."""
    digits = str(top)
    size = len(digits)
    branches = ["0"] + ([f"[1-9][0-9]{{0,{size - 2}}}"] if size > 1 else [])  # fewer digits than top
    for i, digit in enumerate(digits):  # as many digits: top's first i, then a smaller one, then any
        low = 1 if i == 0 else 0
        if int(digit) > low:
            branches.append(f"{digits[:i]}[{low}-{int(digit) - 1}][0-9]{{{size - i - 1}}}")
    branches.append(digits)
    return f"^0*(?:{'|'.join(branches)})$"


def _request_components(schema: dict[str, Any]) -> set[str]:
    """The components a request body refers to, directly or through another component."""
    found: set[str] = set()
    todo = [op.get("requestBody", {}) for path in schema.get("paths", {}).values() for op in path.values()
            if isinstance(op, dict)]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
                name = ref.rsplit("/", 1)[1]
                if name not in found:
                    found.add(name)
                    todo.append(schema["components"]["schemas"].get(name, {}))
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return found


def _bound_body(body: dict[str, Any], limits: Limits) -> None:
    properties = body.get("properties", {})
    _bound(properties.get("queries"), "array", maxItems=limits.max_questions)
    _bound(_items(properties.get("queries")), "string", maxLength=limits.max_question_chars)
    for name in ("max_tokens", "max_completion_tokens"):
        _bound(properties.get(name), "integer", maximum=limits.max_tokens_cap)
    _bound(properties.get("timeout_ms"), "integer", maximum=limits.max_timeout_ms)
    for name in ("n", "best_of"):
        _bound(properties.get(name), "integer", maximum=limits.max_questions)
    for name in _TEXT_FIELDS:
        _bound(properties.get(name), "string", maxLength=limits.max_question_chars)
    for branch in (properties.get("guided_choice") or {}).get("anyOf", []):
        _bound(branch.get("items"), "string", minLength=1)
    if "temperature" in properties:
        _exclude_tiny_temperatures(properties["temperature"])
    _bound(properties.get("seed"), "integer", maximum=MAX_SEED)  # exact: the generated one is a rounded float


def _bound_completion_prompt(prompt: dict[str, Any], limits: Limits) -> None:
    """The completions route refuses an empty prompt, or an empty one in a list (the Kev API answers it with
    that question's error result)."""
    _bound(prompt, "string", minLength=1)
    for branch in prompt.get("anyOf", []):
        _bound(branch.get("items"), "string", minLength=1, maxLength=limits.max_question_chars)


def _bound(schema: dict[str, Any] | None, kind: str, **keywords: int) -> None:
    """Set keywords on the schema, or on each anyOf / oneOf branch of that type (never loosening one)."""
    if schema is None:
        return
    branches = schema.get("anyOf") or schema.get("oneOf") or [schema]
    for branch in branches:
        if branch.get("type") == kind:
            for keyword, value in keywords.items():
                tighter = max if keyword.startswith("min") else min
                branch[keyword] = tighter(value, int(branch.get(keyword, value)))


def _items(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if schema is None else schema.get("items")


def _exclude_tiny_temperatures(schema: dict[str, Any]) -> None:
    """0 (greedy) or at least MIN_TEMPERATURE: what the validator accepts, as two number branches."""
    branches = schema.get("anyOf") or [schema]
    for i, branch in enumerate(branches):
        if branch.get("type") == "number":
            greedy = {"type": "number", "enum": [0]}
            sampled = {**branch, "minimum": MIN_TEMPERATURE}
            if "anyOf" in schema:
                schema["anyOf"][i:i + 1] = [greedy, sampled]
            else:
                schema.clear()
                schema["anyOf"] = [greedy, sampled]
            return
