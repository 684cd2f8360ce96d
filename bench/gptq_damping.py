"""GPTQ's damping for w8a8 (kev/model/gptq.py DAMP) by the w8a8 output error on text GPTQ never saw: on the default
model, α-searched and folded as Kev loads it, each linear named gets its input from one fp32 forward of the
calibration text (kev/model/calibration/smoothing.txt, what GPTQ fits) and one of other text (README.md, never
bench/data), and for round to nearest and GPTQ at each damping prints its w8a8 output error on both (input quantized
per row as the kernel does, against X W^T in fp32). The summary adds each linear's error over its round-to-nearest
error on the other text, so every linear weighs the same.

    KEV_CACHE_DIR=/tmp/kevcache-w8a8 .venv/bin/python bench/gptq_damping.py [--damps 0.03,0.3,1,3,10]
        [--layers 0,5,10,15,20,25,29]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from kev.model import smoothing
from kev.model.calibration_forward import prompt_logits
from kev.model.families import model_class
from kev.model.gptq import gptq_rows
from kev.model.model_config import ModelConfig
from kev.model.model_store import resolve_model_path
from kev.model.quant_weight import quantize_per_row
from kev.model.quantize import quantize_rows
from kev.model.tokenizer import Tokenizer
from kev.model.weights import _finish, _read_safetensors, _to_kev_names

LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
OTHER = Path(__file__).parent.parent / "README.md"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--damps", default="0.03,0.3,1,3,10")
    parser.add_argument("--layers", default="0,5,10,15,20,25,29")
    args = parser.parse_args()
    damps = [float(d) for d in args.damps.split(",")]
    folder = resolve_model_path(args.model)
    cfg = ModelConfig.from_folder(folder)
    tokenizer = Tokenizer.from_folder(folder)
    texts = {"calibration": tokenizer.encode(smoothing.CALIBRATION.read_text(encoding="utf-8")),
             "other": tokenizer.encode(OTHER.read_text(encoding="utf-8"))[:1500]}

    def build(state: dict[str, torch.Tensor], positions: int) -> torch.nn.Module:
        with torch.device("meta"):
            model = model_class(cfg)(cfg, positions)
        return _finish(model, state, "fp32", torch.device("cpu"))

    state = _to_kev_names(_read_safetensors(folder), cfg)
    calibration = build(state, len(texts["calibration"]))
    stats, per_layer, _ = smoothing.search_alphas(calibration, texts["calibration"], smoothing.GRID)
    smoothing.smooth_state(state, calibration, stats, per_layer)
    model = build(state, 4096)
    names = [f"layers.{i}.{linear}" for i in map(int, args.layers.split(",")) for linear in LINEARS]
    inputs: dict[tuple[str, str], torch.Tensor] = {}
    modules = dict(model.named_modules())
    for text, ids in texts.items():
        def grab(name: str, text: str = text):  # noqa: ANN202
            return lambda module, a: inputs.__setitem__((text, name), a[0].detach().float().reshape(-1, a[0].shape[-1]))
        handles = [modules[name].register_forward_pre_hook(grab(name)) for name in names]
        prompt_logits(model, ids)
        for handle in handles:
            handle.remove()
    totals: dict[str, list[float]] = {}
    for name in names:
        weight = modules[name].weight.detach().float()
        q, scale = quantize_rows(weight)
        fit = inputs[("calibration", name)]
        hessian = fit.t().double() @ fit.double()
        candidates = {"round to nearest": q.float() * scale[:, None]}
        candidates |= {f"gptq {d:g}": gptq_rows(weight, hessian, scale, d) for d in damps}
        errors = {}
        for label, wq in candidates.items():
            errors[label] = []
            for text in texts:
                x = inputs[(text, name)]
                qx, dx = quantize_per_row(x)
                errors[label].append(float(((qx.float() * dx[:, None]) @ wq.t() - x @ weight.t()).square().mean()))
        rtn = errors["round to nearest"]
        print(name, " ".join(f"{label}: {e[0] / rtn[0]:.3f}/{e[1] / rtn[1]:.3f}" for label, e in errors.items()),
              flush=True)
        for label, e in errors.items():
            totals.setdefault(label, [0.0, 0.0])
            totals[label] = [totals[label][0] + e[0] / rtn[1], totals[label][1] + e[1] / rtn[1]]
    base = totals["round to nearest"]
    print("summed, against round to nearest (calibration text / other text):")
    for label, (on_fit, on_other) in totals.items():
        print(f"  {label}: {on_fit / base[0]:.3f} / {on_other / base[1]:.3f}")


if __name__ == "__main__":
    main()
