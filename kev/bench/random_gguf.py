"""A Llama-1B-shaped GGUF with random weights (`kev bench --random-gguf Q4_0|Q8_0|Q4_K|Q5_K|Q6_K|Q4_K_M`): what a CPU
user's 4- to 8-bit 1B file costs to serve, without shipping one. Shape of Llama-3.2-1B (hidden 2048, 16 layers, 32
heads, 8 KV heads, FFN 8192, tied head) with the default model's tokenizer (vocabulary 49,152 instead of 128,256).
Weights N(0, 0.02) quantized with the `gguf` package; the package cannot quantize to K-quants, so those are random
blocks (random quants and integer scales, fp16 scales picked for a spread near 0.02: any bit pattern of the quants is
a valid block). Q4_K_M mixes types as llama.cpp's Q4_K_M does: Q4_K, with Q6_K for the (tied) head and, in
llama.cpp's "more bits" layers, for attn_v and ffn_down. Norms 1. Written once under $KEV_CACHE_DIR/bench."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import quantize

from kev.model.gguf_weights import read_blocks
from kev.model.model_store import ALIASES, _alias_gguf, cache_root
from kev.model.quant_weight import QuantWeight

SHAPE = {"hidden": 2048, "layers": 16, "heads": 32, "kv_heads": 8, "ffn": 8192}
TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M")
# K-quants: (byte offsets of the fp16 d and dmin in a super-block, d for a weight spread near 0.02, dmin / d)
_K_SCALES = {GGMLQuantizationType.Q4_K: ((0, 2), 6e-5, 7.5), GGMLQuantizationType.Q5_K: ((0, 2), 3e-5, 15.5),
             GGMLQuantizationType.Q6_K: ((208,), 1.5e-5, 0.0)}
_TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                   "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                   "tokenizer.ggml.padding_token_id", "tokenizer.ggml.unknown_token_id", "tokenizer.chat_template",
                   "tokenizer.ggml.add_bos_token")


def random_llama_gguf(qtype_name: str) -> Path:
    """The file for this quant type (one of TYPES), written on first use."""
    mixed = qtype_name == "Q4_K_M"
    qtype = GGMLQuantizationType.Q4_K if mixed else GGMLQuantizationType[qtype_name]
    path = cache_root() / "bench" / f"llama-1b-shape-random-{qtype_name}.gguf"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    _write(partial, qtype, SHAPE, types=q4_k_m_types(SHAPE["layers"]) if mixed else None)
    partial.replace(path)
    return path


def q4_k_m_types(layers: int) -> dict[str, GGMLQuantizationType]:
    """llama.cpp's Q4_K_M choices beyond Q4_K (its llama_tensor_get_type): Q6_K for the head (here the tied
    token_embd) and for attn_v and ffn_down in the first and last eighth of the layers and every third between."""
    def more_bits(i: int) -> bool:
        return i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2

    q6 = GGMLQuantizationType.Q6_K
    return {"token_embd": q6} | {f"blk.{i}.{part}": q6 for i in range(layers) if more_bits(i)
                                  for part in ("attn_v", "ffn_down")}


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


def random_blocks(qtype: GGMLQuantizationType, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, bytes] of `qtype` blocks standing for random weights of spread ~0.02."""
    if qtype not in _K_SCALES:
        return quantize((rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float32), qtype)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    at, d, dmin_per_d = _K_SCALES[qtype]
    scale = (d * rng.uniform(0.5, 1.5, raw.shape[:2])).astype(np.float16)
    for offset, value in zip(at, (scale, (scale.astype(np.float32) * dmin_per_d).astype(np.float16))):
        raw[..., offset: offset + 2] = value[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


def random_quant_weight(folder: Path, name: str, k: int, n: int) -> QuantWeight:
    """One [n, k] linear of random `name` blocks (a GGMLQuantizationType name), read back through a one-tensor GGUF
    in `folder` as the engine reads a file's weights (the kernel benchmarks' weights)."""
    qtype = GGMLQuantizationType[name]
    path = folder / f"{name}-{k}-{n}.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("w", random_blocks(qtype, n, k, np.random.default_rng(0)), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    held = read_blocks(GGUFReader(path).tensors[0])
    assert held is not None
    return held.to_weight()


def write_random_llama_gguf(path: Path, qtype: GGMLQuantizationType, s: dict[str, int], seed: int = 0,
                            types: dict[str, GGMLQuantizationType] | None = None) -> None:
    """A llama GGUF of shape `s` (SHAPE's keys) with random `qtype` weights and the default model's tokenizer;
    `types` overrides the type of tensors by name (blk.3.attn_v) or part name (token_embd, attn_q, ..., ffn_down)."""
    _write(path, qtype, s, seed, types or {})


def _write(path: Path, qtype: GGMLQuantizationType, s: dict[str, int], seed: int = 0,
           types: dict[str, GGMLQuantizationType] | None = None) -> None:
    rng, types = np.random.default_rng(seed), types or {}
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
        kind = types.get(name.removesuffix(".weight"), types.get(name.split(".")[-2], qtype))
        writer.add_tensor(name, random_blocks(kind, rows, cols, rng), raw_dtype=kind)

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
