"""Turn a llama-architecture GGUF into a Hugging Face style folder (float32 weights).

Only the parts Kev needs: dequantized weights under HF names, a LlamaConfig-compatible
config.json, and a byte-level BPE tokenizer.json rebuilt from the GGUF vocabulary.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf.quants as gguf_quants
import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.numpy import save_file
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from kev.errors import UnsupportedModelError
from kev.model.cache_manifest import write_manifest

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token_type values

# GGUF per-layer tensor name -> HF per-layer name (same suffix .weight / .bias).
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")

# The split regex of llama-3 style BPE vocabularies (llama.cpp pre "llama-bpe").
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class _Meta:
    """The GGUF metadata the conversion reads, with the architecture prefix resolved."""

    fields: dict[str, Any]
    arch: str

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def arch_get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(f"{self.arch}.{key}", default)


def convert_gguf_to_hf_folder(gguf_path: Path, out_dir: Path) -> Path:
    """Write config.json, model.safetensors, tokenizer.json and tokenizer_config.json to out_dir.

    The folder is built under a temporary name next to out_dir and renamed into place, so a
    reader never sees it half-written. If another process finished first, its folder is kept.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = GGUFReader(gguf_path)
    meta = _read_meta(reader)
    if meta.arch != "llama":
        raise UnsupportedModelError(f"{gguf_path}: GGUF architecture {meta.arch!r} is not supported (only 'llama')")

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        tensors = _convert_tensors(reader, meta)
        config = _build_config(meta, tensors)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        del tensors
        _build_tokenizer(meta).save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "tokenizer_config.json", _build_tokenizer_config(meta))
        # mkdtemp makes the folder private; the cache is meant to be shared like any HF folder.
        tmp.chmod(0o755)
        for f in tmp.iterdir():
            f.chmod(0o644)
        write_manifest(tmp)  # last: a folder without it (an interrupted conversion) is never trusted
        try:
            os.rename(tmp, out_dir)
        except OSError:
            if not (out_dir / "config.json").is_file():
                raise
            # Lost a race with a concurrent conversion of the same file; theirs is equivalent.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _read_meta(reader: GGUFReader) -> _Meta:
    fields = {name: field.contents() for name, field in reader.fields.items()}
    return _Meta(fields=fields, arch=str(fields.get("general.architecture", "")))


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE pairs -> HF rotate_half halves); any trailing dims
    (a quantized tensor's blocks) move with their row.

    llama.cpp wrote w.reshape(n_head, 2, d, ...).swapaxes(1, 2); this is its inverse, the same
    formula as transformers' LlamaTensorProcessor._reverse_permute_weights.
    """
    d = w.shape[0] // n_head // 2
    return w.reshape(n_head, d, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _dequantize(t: Any) -> np.ndarray:
    """A tensor as float32; a quantization type the gguf package cannot dequantize is named, with those it can."""
    try:
        return dequantize(t.data, t.tensor_type)
    except NotImplementedError:
        known = ["F32", "F16", *sorted(q.name for q in getattr(gguf_quants, "_type_traits", {}))]
        raise UnsupportedModelError(f"GGUF tensor {t.name!r} has type {t.tensor_type.name}, which cannot be "
                                    f"dequantized (supported: {', '.join(known)})") from None


def _convert_tensors(reader: GGUFReader, meta: _Meta) -> dict[str, np.ndarray]:
    n_head = int(meta.arch_get("attention.head_count"))
    n_kv = int(meta.arch_get("attention.head_count_kv", n_head))
    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":
            # Llama-3.1 style frequency factors live only in this tensor; dropping it would
            # silently change the model, so refuse instead.
            raise UnsupportedModelError("GGUF tensor rope_freqs (llama3 rope scaling) is not supported yet")
        # ggml lists dims fastest-first; numpy/HF want them reversed.
        shape = tuple(reversed([int(d) for d in t.shape]))
        w = np.ascontiguousarray(_dequantize(t), dtype=np.float32).reshape(shape)
        name, heads = hf_name(t.name, n_head, n_kv)
        out[name] = w if heads is None else np.ascontiguousarray(unpermute(w, heads))
    return out


def hf_name(name: str, n_head: int, n_kv: int) -> tuple[str, int | None]:
    """A llama GGUF tensor's Hugging Face name, and the head count its rows must be unpermuted by (q, k) or None."""
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name], None
    m = _LAYER_RE.match(name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        raise UnsupportedModelError(f"GGUF tensor {name!r} is not one of a llama model's")
    layer, kind, suffix = m.groups()
    return f"model.layers.{layer}.{_LAYER_NAMES[kind]}.{suffix}", {"attn_q": n_head, "attn_k": n_kv}.get(kind)


def _build_config(meta: _Meta, tensors: dict[str, np.ndarray]) -> dict[str, Any]:
    hidden = int(meta.arch_get("embedding_length"))
    n_head = int(meta.arch_get("attention.head_count"))
    tokens = meta.get("tokenizer.ggml.tokens") or []
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": int(meta.arch_get("feed_forward_length")),
        "num_hidden_layers": int(meta.arch_get("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(meta.arch_get("attention.head_count_kv", n_head)),
        "head_dim": int(
            meta.arch_get("attention.key_length") or meta.arch_get("rope.dimension_count") or hidden // n_head
        ),
        "rms_norm_eps": _f32(meta.arch_get("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": _f32(meta.arch_get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta.arch_get("context_length", 2048)),
        "vocab_size": int(meta.arch_get("vocab_size", len(tokens))),
        "tie_word_embeddings": "lm_head.weight" not in tensors,
        "attention_bias": "model.layers.0.self_attn.q_proj.bias" in tensors,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }
    rope_scaling = _rope_scaling(meta)
    if rope_scaling is not None:
        config["rope_scaling"] = rope_scaling
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = meta.get(f"tokenizer.ggml.{key}")
        if value is not None:
            config[key] = int(value)
    return config


def _f32(value: float) -> float:
    """GGUF stores float32; print its shortest float32 spelling (1e-05, not 9.9999997e-06)."""
    return float(str(np.float32(value)))


def _rope_scaling(meta: _Meta) -> dict[str, Any] | None:
    kind = meta.arch_get("rope.scaling.type")
    if kind in (None, "none"):
        return None
    scaling: dict[str, Any] = {"rope_type": str(kind), "factor": _f32(meta.arch_get("rope.scaling.factor", 1.0))}
    original = meta.arch_get("rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level BPE vocabularies are spelled in."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre == "smollm":
        # HF SmolLM2's tokenizer.json (and llama.cpp's "smollm" regexes): every digit is its own
        # piece first, then GPT-2's byte-level regex split, no prefix space.
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in ("gpt2", "default"):
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("llama3", "llama-v3", "llama-bpe"):
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    raise UnsupportedModelError(f"GGUF tokenizer.ggml.pre {pre!r} is not supported (smollm, gpt2, default, llama-bpe)")


def _build_tokenizer(meta: _Meta) -> HFTokenizer:
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise UnsupportedModelError(f"GGUF tokenizer.ggml.model {model!r} is not supported "
                                    "(only byte-level BPE 'gpt2')")
    tokens: list[str] = list(meta.get("tokenizer.ggml.tokens"))
    types: list[int] = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    # Tokens outside the byte alphabet are stored as raw text; respell them like transformers does.
    vocab = {
        tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode("utf-8")): i
        for i, tok in enumerate(tokens)
    }
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "default")))
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # A control token spelled outside the byte alphabet is a llama.cpp mislabel; adding it
    # would grow the vocabulary past the embedding size (transformers skips them too).
    specials = [t for t, ty in zip(tokens, types) if ty == _CONTROL and set(t) <= alphabet]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    user = [t for t, ty in zip(tokens, types) if ty == _USER_DEFINED and t in vocab]
    if user:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    return tok


def _build_tokenizer_config(meta: _Meta) -> dict[str, Any]:
    tokens = meta.get("tokenizer.ggml.tokens")

    def token(key: str) -> str | None:
        idx = meta.get(f"tokenizer.ggml.{key}")
        return None if idx is None else tokens[int(idx)]

    return {
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "pad_token": token("padding_token_id"),
        "unk_token": token("unknown_token_id"),
        "chat_template": meta.get("tokenizer.chat_template"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.arch_get("context_length", 2048)),
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
