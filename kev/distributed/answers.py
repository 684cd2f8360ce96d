"""The answers bucket: one key per question, created once. The first create wins; everyone who
loses reads the winner back. This is the whole of "answered exactly once", for worker answers,
the aggregator's timeout placeholders and the router's cancellations alike."""
from __future__ import annotations

import json
import logging

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from kev.results.result import Result
from kev.distributed.messages import MalformedMessage, result_from_dict, seal, unseal
from kev.distributed.subjects import answer_key

log = logging.getLogger("kev.distributed")


async def claim(answers: KeyValue | None, result: Result) -> tuple[int, Result]:
    """(revision, the question's accepted answer): `result` if it came first, else the earlier one.

    answers=None (NATS away): `result` stands, unarbitrated, with revision -1."""
    if answers is None:
        return -1, result
    key = answer_key(result.request_id, result.index)
    try:
        return await answers.create(key, seal(json.dumps(result.to_dict(), ensure_ascii=False).encode())), result
    except KeyWrongLastSequenceError:
        found = await read_answer(answers, result.request_id, result.index)
        if found is None:  # created, then expired in between: ours stands
            return -1, result
        return found


async def read_answer(answers: KeyValue, request_id: str, index: int) -> tuple[int, Result] | None:
    try:
        entry = await answers.get(answer_key(request_id, index))
    except KeyNotFoundError:
        return None
    if entry.value is None:
        return None
    try:
        body = unseal(entry.value, "answer")
    except MalformedMessage as err:  # written by someone without the cluster secret: never served
        log.warning("answers bucket: %s (request %s question %d); ignored", err, request_id, index)
        return None
    return entry.revision or 0, result_from_dict(json.loads(body))
