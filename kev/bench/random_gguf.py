"""A Llama-1B-shaped GGUF with random weights (`kev bench --random-gguf Q4_0|Q8_0`): what a CPU user's 4- or 8-bit
1B file costs to serve, without shipping one. Shape of Llama-3.2-1B (hidden 2048, 16 layers, 32 heads, 8 KV heads,
FFN 8192, tied head) with the default model's tokenizer (vocabulary 49,152 instead of 128,256). Weights N(0, 0.02)
quantized with the `gguf` package, norms 1. Written once under $KEV_CACHE_DIR/bench."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import quantize

from kev.model.model_store import ALIASES, _alias_gguf, cache_root

SHAPE = {"hidden": 2048, "layers": 16, "heads": 32, "kv_heads": 8, "ffn": 8192}
_TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                   "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                   "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.chat_template",
                   "tokenizer.ggml.add_bos_token")


def random_llama_gguf(qtype_name: str) -> Path:
    """The file for this quant type (Q4_0 or Q8_0), written on first use."""
    qtype = GGMLQuantizationType[qtype_name]
    path = cache_root() / "bench" / f"llama-1b-shape-random-{qtype_name}.gguf"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    _write(partial, qtype)
    partial.replace(path)
    return path


def _copy_tokenizer(writer: GGUFWriter) -> int:
    """The default model's tokenizer fields, as they are; returns the vocabulary size."""
    alias = "smollm2-135m-instruct"
    source = GGUFReader(_alias_gguf(alias, ALIASES[alias]))
    vocab = 0
    for key in _TOKENIZER_KEYS:
        field = source.fields.get(key)
        if field is None:
            continue
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            vocab = len(value)
        writer.add_key_value(key, value, field.types[0], sub_type=field.types[-1] if len(field.types) > 1 else None)
    return vocab


def _write(path: Path, qtype: GGMLQuantizationType) -> None:
    s, rng = SHAPE, np.random.default_rng(0)
    writer = GGUFWriter(str(path), "llama")
    head_dim = s["hidden"] // s["heads"]
    writer.add_context_length(4096)
    writer.add_embedding_length(s["hidden"])
    writer.add_block_count(s["layers"])
    writer.add_feed_forward_length(s["ffn"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(500000.0)
    vocab = _copy_tokenizer(writer)
    writer.add_vocab_size(vocab)

    def weight(name: str, rows: int, cols: int) -> None:
        data = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32)
        writer.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)

    weight("token_embd.weight", vocab, s["hidden"])
    writer.add_tensor("output_norm.weight", np.ones(s["hidden"], dtype=np.float32))
    kv = s["kv_heads"] * head_dim
    for i in range(s["layers"]):
        for part, rows, cols in (("attn_q", s["hidden"], s["hidden"]), ("attn_k", kv, s["hidden"]),
                                 ("attn_v", kv, s["hidden"]), ("attn_output", s["hidden"], s["hidden"]),
                                 ("ffn_gate", s["ffn"], s["hidden"]), ("ffn_up", s["ffn"], s["hidden"]),
                                 ("ffn_down", s["hidden"], s["ffn"])):
            weight(f"blk.{i}.{part}.weight", rows, cols)
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{i}.{norm}.weight", np.ones(s["hidden"], dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
