"""vLLM's tokenizer routes: /tokenize, /detokenize, /tokenizer_info
(lm-evaluation-harness's remote tokenizer uses them)."""
from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from kev.wire.bodies.api_models import ChatMessage, Text, _Body
from kev.wire.bodies.errors import ApiError
from kev.server.errors import error_responses
from kev.server.routes_kev import get_service
from kev.server.service import KevService

router = APIRouter(tags=["tokenizer"])


class TokenizeBody(_Body):
    """Exactly one of prompt (text as is) or messages (rendered with the chat template)."""

    model: Text | None = None
    prompt: Text | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: bool = Field(False,
                                     description="the tokenizer's post-processor tokens (e.g. BOS), if it has any")
    add_generation_prompt: bool = True


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int


class DetokenizeBody(_Body):
    model: Text | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


class DetokenizeResponse(BaseModel):
    prompt: str


@router.post("/tokenize", response_model=TokenizeResponse, responses=error_responses(400, 401, 413, 422, 503),
             summary="Token ids of a prompt (or of chat messages through the chat template)")
async def tokenize(body: TokenizeBody, service: KevService = Depends(get_service)) -> TokenizeResponse:
    tokenizer = service.tokenizer()
    if (body.prompt is None) == (body.messages is None):
        raise ApiError(422, "prompt: needs exactly one of prompt or messages", "prompt")
    if body.messages is not None:
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        service.limits.check_chars(sum(len(m["content"]) for m in messages), "messages")
        text = tokenizer.render_chat(messages, add_generation_prompt=body.add_generation_prompt)
    else:
        service.limits.check_chars(len(body.prompt or ""), "prompt")
        text = body.prompt or ""
    ids = tokenizer.encode(text, add_special_tokens=body.add_special_tokens)
    return TokenizeResponse(tokens=ids, count=len(ids), max_model_len=service.config.core.max_context)


@router.post("/detokenize", response_model=DetokenizeResponse, responses=error_responses(400, 401, 422, 503),
             summary="The text of token ids (special tokens kept)")
async def detokenize(body: DetokenizeBody, service: KevService = Depends(get_service)) -> DetokenizeResponse:
    tokenizer = service.tokenizer()
    outside = next((i for i, t in enumerate(body.tokens) if t >= tokenizer.vocab_size), None)
    if outside is not None:
        raise ApiError(400, f"tokens[{outside}]: token id {body.tokens[outside]} is outside the vocabulary "
                            f"(0..{tokenizer.vocab_size - 1})", f"tokens[{outside}]")
    return DetokenizeResponse(prompt=tokenizer.decode(body.tokens, skip_special_tokens=False))


@router.get("/tokenizer_info", responses=error_responses(401, 503), summary="Special tokens and chat template")
async def tokenizer_info(service: KevService = Depends(get_service)) -> dict[str, Any]:
    tokenizer = service.tokenizer()
    return {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": tokenizer.eos_token,
            "bos_token": tokenizer.bos_token, "pad_token": tokenizer.pad_token, "unk_token": None,
            "chat_template": tokenizer.chat_template, "model_max_length": service.config.core.max_context,
            "vocab_size": tokenizer.vocab_size}
