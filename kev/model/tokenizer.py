"""A thin tokenizer over `tokenizers.Tokenizer` plus chat-template rendering and streaming decode."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from kev.errors import ConfigError, DamagedModelError
from kev.model.model_config import read_model_json

_REPLACEMENT = "\ufffd"  # what a lossy UTF-8 decode ends with while a character is incomplete


class Tokenizer:
    """Encode/decode text for one model folder and render its chat template."""

    def __init__(
        self,
        backend: HFTokenizer,
        *,
        chat_template: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        eos_token_ids: list[int] | None = None,
    ) -> None:
        self._backend = backend
        self._chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.eos_token_ids: list[int] = list(eos_token_ids or [])
        self._template: jinja2.Template | None = None

    @classmethod
    def from_folder(cls, path: Path, chat_template: str | None = None) -> Tokenizer:
        """Read tokenizer.json, tokenizer_config.json, the chat template and the eos ids of config.json(s).

        chat_template (core.chat_template, --chat-template) overrides the folder's: a file path, or the template
        itself."""
        path = Path(path)
        try:
            backend = HFTokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as err:  # the tokenizers library raises a bare Exception for a damaged or missing file
            raise DamagedModelError(f"{path / 'tokenizer.json'}: not a tokenizer Kev can read ({err}); restore it, "
                                    f"or download or convert the model again") from None
        tok_config = _read_json(path / "tokenizer_config.json")
        bos, eos = _token_text(tok_config.get("bos_token")), _token_text(tok_config.get("eos_token"))
        eos_ids: list[int] = []
        # generation_config.json is where HF folders list extra stop ids (e.g. Llama-3's <|eot_id|>).
        for name in ("config.json", "generation_config.json"):
            eos_ids += _as_id_list(_read_json(path / name).get("eos_token_id"))
        if eos is not None and (eos_id := backend.token_to_id(eos)) is not None:
            eos_ids.append(eos_id)
        template = resolve_chat_template(chat_template) if chat_template else folder_chat_template(path, tok_config)
        return cls(
            backend,
            chat_template=template,
            bos_token=bos,
            eos_token=eos,
            eos_token_ids=list(dict.fromkeys(eos_ids)),
        )

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return bool(self._chat_template)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of text; special tokens written in the text are recognised, none are added (unless asked)."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry (for byte-level BPE, one character per byte), not decoded text."""
        return self._backend.id_to_token(token_id)

    def is_special(self, token_id: int) -> bool:
        added = self._backend.get_added_tokens_decoder().get(token_id)
        return bool(added is not None and added.special)

    @property
    def pad_token(self) -> str | None:
        padding = self._backend.padding
        return padding.get("pad_token") if padding else None

    @property
    def chat_template(self) -> str | None:
        return self._chat_template

    def to_json(self) -> str:
        """The tokenizer.json text (what grammar libraries build their token tables from)."""
        return self._backend.to_str()

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None) -> str:
        """The prompt text the model's chat template makes of messages (like HF apply_chat_template, tools too)."""
        if not self._chat_template:
            raise ValueError("this tokenizer has no chat_template")
        if self._template is None:
            self._template = _jinja_env().from_string(self._chat_template)
        return self._template.render(
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )

    def incremental_decoder(self, skip_special_tokens: bool = True) -> IncrementalDecoder:
        return IncrementalDecoder(self, skip_special_tokens=skip_special_tokens)


class IncrementalDecoder:
    """Streams the text of one generated sequence, token by token, in whole characters.

    Keeps a small window: the tokens already emitted since the last boundary (prefix) and the
    pending ones. Decoding the window rather than the pending tokens alone keeps decoders that
    depend on context (e.g. sentencepiece's leading-space rule) correct. A window whose text ends
    in U+FFFD is mid-character, so nothing is emitted until a later token completes it.
    tokenizers' DecodeStream does the same but cannot flush a trailing partial character.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # window start: ids before it are fully emitted and forgotten
        self._read = 0  # ids[_prefix:_read] are emitted; ids[_read:] are pending

    def push(self, token_id: int) -> str:
        """Add one token; return the newly completed text (possibly "")."""
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        # Keep only the window; the emitted history is never decoded again.
        del self._ids[: self._prefix]
        self._read -= self._prefix
        self._prefix = 0
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """Text still held back at the end of the sequence (a partial character decodes as U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        new_text = self._decode(self._ids[self._prefix :])
        self._ids, self._prefix, self._read = [], 0, 0
        return new_text[len(prefix_text) :]

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip) if ids else ""


def folder_chat_template(path: Path, tok_config: dict[str, Any]) -> str | None:
    """Where transformers finds it: chat_template.jinja (what it saves now) over tokenizer_config.json; a processor's
    legacy chat_template.json when neither has one."""
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text(encoding="utf-8")
    for template in (tok_config.get("chat_template"), _read_json(path / "chat_template.json").get("chat_template")):
        if isinstance(template, list):  # the named-templates form; "default" is what HF picks
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if template:
            return str(template)
    return None


def resolve_chat_template(value: str) -> str:
    """A file path, or the template itself (anything with braces or a newline), as vLLM's --chat-template reads it."""
    if any(c in value for c in "{}\n"):
        return value
    try:
        return Path(value).expanduser().read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"core.chat_template: {value!r} is neither a readable file ({err.strerror or err}) "
                          "nor a template (no braces in it)") from None


def _jinja_env() -> ImmutableSandboxedEnvironment:
    """The environment transformers renders chat templates in (minus its generation-tracking tag)."""

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        # Jinja's own tojson HTML-escapes; templates expect plain JSON.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def _read_json(path: Path) -> dict[str, Any]:
    return read_model_json(path) if path.is_file() else {}


def _token_text(token: Any) -> str | None:
    """tokenizer_config stores special tokens as a string or a serialized AddedToken dict."""
    if isinstance(token, dict):
        return token.get("content")
    return token if isinstance(token, str) else None


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]
