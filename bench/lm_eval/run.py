"""Acceptance with a real client: lm-evaluation-harness against `kev serve`, beside lm-eval's own HF backend.

Two local tasks (bench/lm_eval/data, no hub): kev_mc (multiple_choice: loglikelihoods through
/v1/completions with token-id prompts, echo and logprobs; tokenizer through /tokenize and
/tokenizer_info) and kev_gen (generate_until). Both run with `--model local-completions
tokenizer_backend=remote` against `kev serve` (fp32), then with `--model hf` on the same
converted model folder; the per-item loglikelihoods must agree to --rtol and the scores and
generations must be equal. Prints a markdown table (README) and exits 1 on a mismatch.

    make install && python3 -m venv .venv-lmeval && .venv-lmeval/bin/pip install torch==2.13.0 'lm-eval[api,hf]==0.4.13'
    OMP_NUM_THREADS=1 .venv/bin/python bench/lm_eval/run.py
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
MODEL = "smollm2-135m-instruct"
TASKS = {
    "kev_mc": """task: kev_mc
dataset_path: json
dataset_kwargs: {{data_files: {{test: "{data}/mc.jsonl"}}}}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list: [{{metric: acc}}, {{metric: acc_norm}}]
""",
    "kev_gen": """task: kev_gen
dataset_path: json
dataset_kwargs: {{data_files: {{test: "{data}/gen.jsonl"}}}}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nShort answer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs: {{until: ["\\n", "."], max_gen_toks: 12, do_sample: false, temperature: 0}}
metric_list: [{{metric: exact_match, ignore_case: true, ignore_punctuation: true, regexes_to_ignore: [" "]}}]
""",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm-eval", default=str(ROOT / ".venv-lmeval" / "bin" / "lm_eval"))
    parser.add_argument("--rtol", type=float, default=1e-4)
    parser.add_argument("--out", default=None, help="keep lm-eval's outputs here (default: a temp folder)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="kev-lmeval-"))
    tasks = out / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    for name, text in TASKS.items():
        (tasks / f"{name}.yaml").write_text(text.format(data=DATA))
    server, port = start_server(out)
    try:
        started = time.monotonic()
        run_lm_eval(args.lm_eval, "local-completions", f"model={MODEL},base_url=http://127.0.0.1:{port}/v1/completions,"
                    "tokenizer_backend=remote,tokenized_requests=True,num_concurrent=1,max_retries=1", tasks, out / "kev",
                    ["--batch_size", "8"])  # 8 token-id prompts per request: one engine run, one channel each
        kev_seconds = time.monotonic() - started
    finally:
        server.terminate()
        server.wait(60)
    started = time.monotonic()
    run_lm_eval(args.lm_eval, "hf", f"pretrained={model_folder()},dtype=float32", tasks, out / "hf",
                ["--device", "cpu", "--batch_size", "1"])
    hf_seconds = time.monotonic() - started
    ok, table = compare(out / "kev", out / "hf", args.rtol)
    print(table)
    print(f"\nlm-eval wall time: kev serve {kev_seconds:.0f} s, hf {hf_seconds:.0f} s; outputs in {out}")
    return 0 if ok else 1


def model_folder() -> str:
    code = "from kev.model.model_store import resolve_model_path as r; print(r('smollm2-135m-instruct'))"
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def start_server(out: Path) -> tuple[subprocess.Popen[bytes], int]:
    """kev serve in fp32 (the comparison is against HF's fp32), on a port the OS picks."""
    config = out / "kev.yaml"
    config.write_text(json.dumps({"kev": {"core": {"precision": "fp32"},
                                          "router": {"max_parallel_queries": 8, "channel_pool_size": 16}}}))
    log = (out / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "kev.cli.main", "serve", "--config", str(config), "--port", "0"],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"kev serve exited: {(out / 'server.log').read_text()[-2000:]}")
        match = re.search(r"Uvicorn running on http://[\d.]+:(\d+)", (out / "server.log").read_text(errors="replace"))
        if match and _ready(int(match.group(1))):
            return proc, int(match.group(1))
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("kev serve not ready after 300 s")


def _ready(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).status == 200
    except OSError:
        return False


def run_lm_eval(lm_eval: str, model: str, model_args: str, tasks: Path, out: Path, extra: list[str] | None = None) -> None:
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "none")}
    subprocess.run([lm_eval, "--model", model, "--model_args", model_args, "--tasks", ",".join(TASKS),
                    "--include_path", str(tasks), "--log_samples", "--output_path", str(out),
                    *(extra or ["--batch_size", "1"])], check=True, env=env)


def samples(out: Path, task: str) -> list[dict]:
    files = glob.glob(str(out / "**" / f"samples_{task}_*.jsonl"), recursive=True)
    if not files:
        raise FileNotFoundError(f"no samples of {task} under {out}")
    with open(sorted(files)[-1], encoding="utf-8") as f:
        return sorted((json.loads(line) for line in f), key=lambda s: s["doc_id"])


def scores(out: Path) -> dict[str, dict[str, float]]:
    path = sorted(glob.glob(str(out / "**" / "results_*.json"), recursive=True))[-1]
    results = json.loads(Path(path).read_text())["results"]
    return {task: {k.split(",")[0]: v for k, v in metrics.items() if isinstance(v, (int, float)) and "stderr" not in k}
            for task, metrics in results.items()}


def compare(kev: Path, hf: Path, rtol: float) -> tuple[bool, str]:
    kev_mc, hf_mc = samples(kev, "kev_mc"), samples(hf, "kev_mc")
    worst = 0.0
    for a, b in zip(kev_mc, hf_mc, strict=True):
        for (ll_a, _), (ll_b, _) in zip(_loglikelihoods(a), _loglikelihoods(b), strict=True):
            worst = max(worst, abs(ll_a - ll_b) / max(abs(ll_b), 1e-12))
    kev_gen, hf_gen = samples(kev, "kev_gen"), samples(hf, "kev_gen")
    same_text = sum(a["filtered_resps"] == b["filtered_resps"] for a, b in zip(kev_gen, hf_gen, strict=True))
    kev_scores, hf_scores = scores(kev), scores(hf)
    rows = ["| task | metric | kev serve (local-completions) | lm-eval hf backend | equal |", "|---|---|---|---|---|"]
    equal = True
    for task in TASKS:
        for metric, value in sorted(hf_scores[task].items()):
            if metric == "sample_len":
                continue
            other = kev_scores[task].get(metric, math.nan)
            same = other == value
            equal &= same
            rows.append(f"| {task} | {metric} | {other:.4f} | {value:.4f} | {'yes' if same else 'NO'} |")
    n_ll = sum(len(_loglikelihoods(s)) for s in kev_mc)
    rows.append(f"| kev_mc | per-item loglikelihood, max relative difference ({n_ll} items) | {worst:.2e} | "
                f"(tolerance {rtol:g}) | {'yes' if worst <= rtol else 'NO'} |")
    rows.append(f"| kev_gen | generations identical | {same_text}/{len(kev_gen)} | | "
                f"{'yes' if same_text == len(kev_gen) else 'NO'} |")
    ok = equal and worst <= rtol and same_text == len(kev_gen)
    return ok, "\n".join(rows)


def _loglikelihoods(sample: dict) -> list[tuple[float, bool]]:
    """filtered_resps of a multiple_choice doc: one [loglikelihood, is_greedy] per choice (sometimes as strings)."""
    return [(float(r[0]), str(r[1]) == "True") for r in (x[0] if isinstance(x[0], list) else x
                                                         for x in sample["filtered_resps"])]


if __name__ == "__main__":
    sys.exit(main())
