"""What SmoothQuant smoothing buys w8a8's per-token activations on the default model: calibrate per-channel activation
maxima with transformers (fp32) on text that is not the held-out text (README.md and the bench questions), fold
s = amax(X)^α / amax(W)^(1-α) into the weights as SmoothQuant does (RMSNorm weights ÷ s and q/k/v, gate/up columns
· s; up rows ÷ s and down columns · s; v rows ÷ s and o columns · s, one s per kv-head channel), write the folder to
--out, then bench/int8_quality.py's perplexity of bf16 on the original and w8a8 on both folders. The experiment that
led to Kev's load-time fold (kev/model/smoothing.py; bench/smoothing_sweep.py measures that one).
    .venv/bin/python bench/smoothquant_probe.py [--alpha 0.5] [--out /tmp/kev-smoothed]"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import kev
from kev.bench.questions import BENCH_QUESTIONS
from kev.model.model_store import resolve_model_path

HERE = Path(__file__).parent


def calibrate(model, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per linear input: max |x| per channel over the calibration tokens."""
    stats: dict[str, torch.Tensor] = {}

    def hook(name):
        def record(_module, args):
            m = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0).float()
            stats[name] = torch.maximum(stats[name], m) if name in stats else m
        return record

    for name, module in model.named_modules():
        if name.endswith(("q_proj", "o_proj", "gate_proj", "down_proj")):
            module.register_forward_pre_hook(hook(name))
    with torch.no_grad():
        model(ids)
    return stats


def smooth(model, stats: dict[str, torch.Tensor], alpha: float) -> None:
    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    dim = cfg.hidden_size // heads

    def factor(act: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
        wmax = torch.stack([w.abs().amax(0) for w in weights]).amax(0)
        return (act.clamp(min=1e-5) ** alpha / wmax.clamp(min=1e-5) ** (1 - alpha)).clamp(min=1e-5)

    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            p, att, mlp = f"model.layers.{i}.", layer.self_attn, layer.mlp
            s = factor(stats[p + "self_attn.q_proj"], [att.q_proj.weight, att.k_proj.weight, att.v_proj.weight])
            layer.input_layernorm.weight.div_(s)
            for lin in (att.q_proj, att.k_proj, att.v_proj):
                lin.weight.mul_(s)
            s = factor(stats[p + "mlp.gate_proj"], [mlp.gate_proj.weight, mlp.up_proj.weight])
            layer.post_attention_layernorm.weight.div_(s)
            mlp.gate_proj.weight.mul_(s), mlp.up_proj.weight.mul_(s)
            s = factor(stats[p + "mlp.down_proj"], [mlp.down_proj.weight])
            mlp.up_proj.weight.div_(s[:, None]), mlp.down_proj.weight.mul_(s)
            # o's input channel (head h, d) is v's output (kv head h // group, d): one s per kv-head channel
            group = heads // kv_heads
            act = stats[p + "self_attn.o_proj"].view(kv_heads, group, dim).amax(1)
            wmax = att.o_proj.weight.abs().amax(0).view(kv_heads, group, dim).amax(1)
            s = (act.clamp(min=1e-5) ** alpha / wmax.clamp(min=1e-5) ** (1 - alpha)).clamp(min=1e-5)
            att.v_proj.weight.div_(s.reshape(-1)[:, None])
            att.o_proj.weight.mul_(s[:, None, :].expand(kv_heads, group, dim).reshape(-1))


def perplexity(precision: str, folder: Path) -> float:
    import sys
    sys.path.insert(0, str(HERE))
    from int8_quality import perplexities
    config = kev.load_config({"core": {"model_path": str(folder), "precision": precision, "max_context": 4096},
                              "router": {"max_parallel_queries": 4, "channel_pool_size": 4}})
    with kev.Engine(config, background=False) as engine:
        return perplexities(engine)["all"]["perplexity"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--out", default="/tmp/kev-smoothed")
    args = parser.parse_args()
    folder, out = resolve_model_path("smollm2-135m-instruct"), Path(args.out)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    text = (HERE.parent / "README.md").read_text()[:6000] + "\n".join(BENCH_QUESTIONS)
    ids = tok(text, return_tensors="pt").input_ids[:, :1024]
    smooth(model, calibrate(model, ids), args.alpha)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(folder / name, out / name)
    result = {"alpha": args.alpha, "calibration_tokens": ids.shape[1],
              "bf16": perplexity("bf16", folder), "w8a8": perplexity("w8a8", folder),
              "w8a8_smoothed": perplexity("w8a8", out)}
    result["w8a8_over_bf16"] = round(result["w8a8"] / result["bf16"], 4)
    result["w8a8_smoothed_over_bf16"] = round(result["w8a8_smoothed"] / result["bf16"], 4)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
