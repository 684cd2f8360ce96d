"""On a CUDA machine: core.precision int8 and core.tensor_parallel 2, each checked for batch invariance (kev verify's
strict check: packed answers bit-identical to solo, tokens and logits) and timed beside bf16 / tensor_parallel 1, on a
random-weight model of a given shape written as a Hugging Face folder (followers of tensor parallelism load the model
from core.model_path). Run by bench/gpu.sh; prints one JSON line per run.

    python bench/gpu_tp_int8.py --shape llama-1b --tokenizer TOKENIZER_FOLDER
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

import kev
from kev.bench.shapes import SHAPES
from kev.isolation.verify import VERIFY_QUESTIONS, VerifyOptions, run_verify
from kev.model.model_config import ModelConfig
from kev.model.weights import random_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def write_folder(cfg: ModelConfig, tokenizer: Path, out: Path) -> Path:
    """A Hugging Face folder (config.json, bf16 safetensors, the tokenizer's files) of random weights."""
    model = random_model(cfg, "bf16", torch.device("cpu"), 2048)
    state: dict[str, torch.Tensor] = {}
    q, kv, inter = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    for name, tensor in model.state_dict().items():
        if name.endswith("qkv_proj.weight"):
            for part, piece in zip(("q_proj", "k_proj", "v_proj"), tensor.split([q, kv, kv])):
                state["model." + name.replace("qkv_proj", part)] = piece.contiguous()
        elif name.endswith("gate_up_proj.weight"):
            for part, piece in zip(("gate_proj", "up_proj"), tensor.split([inter, inter])):
                state["model." + name.replace("gate_up_proj", part)] = piece.contiguous()
        else:
            state[name if name.startswith("lm_head") else "model." + name] = tensor.contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size, "intermediate_size": inter, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta, "max_position_embeddings": 2048,
        "tie_word_embeddings": cfg.tie_word_embeddings, "bos_token_id": 1, "eos_token_id": 2}))
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, out / name)
    return out


def engine(folder: Path, precision: str, tp: int, n: int, device: str) -> kev.Engine:
    config = kev.load_config({"core": {"model_path": str(folder), "precision": precision, "tensor_parallel": tp,
                                       "max_context": 1024, "device": device},
                              "router": {"max_parallel_queries": n, "channel_pool_size": n,
                                         "default_timeout_ms": 600_000, "strategy": "round_robin"}})
    return kev.Engine(config, record_logits=True, background=False)


def tokens_per_s(e: kev.Engine, n: int, max_tokens: int) -> float:
    questions = [{"prompt_ids": list(range(10 + i, 50 + i)), "max_tokens": max_tokens, "ignore_eos": True}
                 for i in range(n)]
    e.generate(questions[:2], timeout=600)
    started = time.perf_counter()
    answers = e.generate(questions, timeout=600)
    return sum(a.completion_tokens for a in answers) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="llama-1b", choices=sorted(SHAPES))
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of this script on a small shape")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_folder(SHAPES[args.shape], args.tokenizer, Path(tmp) / args.shape)
        for precision, tp in (("bf16", 1), ("int8", 1), ("bf16", 2), ("int8", 2)):
            started = time.perf_counter()
            e = engine(folder, precision, tp, 16, args.device)
            loaded = time.perf_counter() - started
            try:
                report = run_verify(e, VerifyOptions(VERIFY_QUESTIONS[:6], trials=2, max_tokens=6, seed=7))
                speed = {f"n{n}": round(tokens_per_s(e, n, args.max_tokens), 1) for n in (1, 16)}
                print(json.dumps({"shape": args.shape, "precision": precision, "tensor_parallel": tp,
                                  "load_s": round(loaded, 1), "verify_ok": report.ok,
                                  "identical": f"{report.identical}/{report.comparisons}",
                                  "max_abs_logit_diff": report.max_abs_logit_diff, "tok_per_s": speed,
                                  "rows": e.runner.tiling.label, "weight_bytes": e.runner.model.weight_bytes(),
                                  "fingerprint": e.runner.fingerprint}), flush=True)
            except Exception as error:  # noqa: BLE001 - one failed run is reported, the others still run
                print(json.dumps({"shape": args.shape, "precision": precision, "tensor_parallel": tp,
                                  "error": f"{type(error).__name__}: {error}"}), flush=True)
            finally:
                e.close()


if __name__ == "__main__":
    main()
