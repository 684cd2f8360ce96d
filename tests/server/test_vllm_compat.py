"""Coming from vLLM: `kev serve MODEL` with vLLM's flags (mapped onto the config, shown in the banner, refused
where they contradict the YAML; a port in use is one line), and /metrics under vLLM's names and labels after real
traffic: every metric vLLM's Grafana dashboard queries (examples/vllm-dashboard-queries.md) has a sample with
model_name, and each agrees with Kev's own metric of the same quantity."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from harness import REPO, ServerProcess, metric

from kev.cli.main import main

pytestmark = pytest.mark.service

QUERIES = REPO / "examples" / "vllm-dashboard-queries.md"
NAME = "smol-served"


def dashboard_series() -> set[str]:
    blocks = [part.split("```")[0] for part in QUERIES.read_text().split("```promql")[1:]]
    dashboard = [line for line in blocks[0].splitlines() if line.strip() and not line.startswith("#")]
    assert len(dashboard) == 29  # every expression of vLLM's dashboard, one per line
    names = set(re.findall(r"\bvllm:[a-z0-9_:]+", "\n".join(blocks))) - {"vllm:"}
    assert len(names) >= 20
    return names


VLLM_ARGS = ["smollm2-135m-instruct", "--served-model-name", NAME, "--max-model-len", "1536", "--dtype", "float32",
             "--max-num-seqs", "3", "--tool-call-parser", "hermes", "--enable-auto-tool-choice"]


@pytest.fixture(scope="module")
def server(start_server) -> ServerProcess:
    """Started as a vLLM user would (the harness adds --config and --port 0)."""
    return start_server({"router": {"default_timeout_ms": 120_000}, "core": {"kernels": "torch"}},
                        extra_args=VLLM_ARGS)


def test_vllm_flags_reach_the_config_and_the_banner(server: ServerProcess, client_for) -> None:
    card = client_for(server).get("/v1/models").json()["data"][0]
    assert card["id"] == NAME and card["max_model_len"] == 1536
    log = server.log()
    assert "--dtype float32 -> core.precision=fp32" in log and "--max-model-len -> core.max_context=1536" in log
    assert "--max-num-seqs -> router.max_parallel_queries=3" in log and "router.channel_pool_size=16" in log
    assert "max_parallel 3, channel pool 16, max_context 1536" in log and "fp32" in log


def _yaml(tmp_path: Path, config: dict) -> str:
    path = tmp_path / "kev.yaml"
    path.write_text(json.dumps({"kev": config}))
    return str(path)


@pytest.mark.parametrize("command", [["serve"], ["run", "hi"]])
def test_a_flag_contradicting_the_yaml_names_both(capsys, tmp_path: Path, command: list[str]) -> None:
    config = _yaml(tmp_path, {"core": {"max_context": 2048, "precision": "bf16"}})
    assert main([*command, "--config", config, "--max-model-len", "2048", "--dtype", "float16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"kev {command[0]}: --dtype float16 contradicts core.precision: bf16 in {config}; drop one of them"
    assert main([*command, "--config", config, "--dtype", "bfloat16", "--max-model-len", "1024"]) == 2
    assert "--max-model-len 1024 contradicts core.max_context: 2048" in capsys.readouterr().err


def test_max_model_len_above_the_models_maximum_names_both(capsys) -> None:
    assert main(["serve", "smollm2-135m-instruct", "--max-model-len", "20000"]) == 2
    assert capsys.readouterr().err.startswith("kev serve: --max-model-len 20000 is above the model's maximum, 8192 "
                                              "tokens")


def test_a_vllm_flag_kev_lacks_is_one_line_naming_it(capsys) -> None:
    assert main(["serve", "smollm2-135m-instruct", "--swap-space", "4", "--enforce-eager"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kev serve: --swap-space is not a flag of kev serve")


def test_vllm_deploy_flags_map_or_say_what_they_mean(capsys, tmp_path: Path) -> None:
    from kev.cli.common import config_and_flags
    from kev.cli.main import build_parser

    args = build_parser().parse_args(["serve", "smollm2-135m-instruct", "--tensor-parallel-size", "2",
                                      "--trust-remote-code", "--config", _yaml(tmp_path, {"core": {"device": "cpu"}})])
    config, flags = config_and_flags(args)
    assert config.core.tensor_parallel == 2 and "--tensor-parallel" in [f.flag for f in flags]
    assert "--trust-remote-code: accepted; Kev runs no code from a model folder" in capsys.readouterr().err
    args = build_parser().parse_args(["serve", "--gpu-memory-utilization", "0.9", "--config",
                                      _yaml(tmp_path, {"core": {"device": "cpu"}})])
    config, _ = config_and_flags(args)
    err = capsys.readouterr().err.strip()
    assert config.core.gpu_memory_utilization == 0.9 and err.count("\n") == 0
    assert err.startswith("kev: --gpu-memory-utilization 0.9: no GPU here (core.device cpu)")


def test_gpu_memory_utilization_sizes_the_pool_by_the_memory_left() -> None:
    from kev.engine.kv.memory_plan import gpu_budget_blocks

    gib = 2**30
    # 0.9 of 80 GiB = 72 GiB; minus 16 GiB of weights and 8 GiB headroom (10%): 48 GiB of 1 MiB blocks.
    assert gpu_budget_blocks(0.9, 80 * gib, 16 * gib, 2**20) == 48 * 1024
    assert gpu_budget_blocks(0.1, 80 * gib, 16 * gib, 2**20) == 0


def test_model_argument_and_model_flag_must_agree(capsys) -> None:
    assert main(["serve", "smollm2-135m-instruct", "--model", "other-model"]) == 2
    assert "MODEL smollm2-135m-instruct contradicts --model other-model (both set core.model_path)" in \
        capsys.readouterr().err


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "kev.cli.main", "serve", "--port", str(port)], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (f"kev serve: port {port} on 127.0.0.1 is already in use (another server?); "
                                   "pick another with --port")


@pytest.fixture(scope="module")
def scrape(server: ServerProcess, client_for) -> str:
    client = client_for(server)
    for prompt in ("Name a colour.", "What is 2+2?"):
        reply = client.post("/v1/chat/completions", json={"model": NAME, "max_tokens": 8, "temperature": 0,
                                                          "messages": [{"role": "user", "content": prompt}]})
        assert reply.status_code == 200, reply.text
    assert client.post("/v1/completions", json={"model": NAME, "prompt": "Once upon", "max_tokens": 3}).status_code \
        == 200
    return client.get("/metrics").text


def test_every_metric_the_vllm_dashboard_queries_has_a_sample(scrape: str) -> None:
    samples = {line.partition("{")[0]: line for line in scrape.splitlines() if line.startswith("vllm:")}
    missing = sorted(name for name in dashboard_series() if name not in samples)
    assert not missing, f"no sample for {missing}"
    unlabelled = [line for line in scrape.splitlines() if line.startswith("vllm:") and f'model_name="{NAME}"'
                  not in line]
    assert not unlabelled


def test_vllm_names_carry_kev_quantities(scrape: str) -> None:
    assert metric(scrape, "vllm:prompt_tokens_total") == metric(scrape, "kev_prompt_tokens_total") > 0
    assert metric(scrape, "vllm:generation_tokens_total") == metric(scrape, "kev_completion_tokens_total") > 0
    assert metric(scrape, "vllm:e2e_request_latency_seconds_count") == 3
    assert metric(scrape, "vllm:time_to_first_token_seconds_sum") == pytest.approx(
        metric(scrape, "kev_time_to_first_token_seconds_sum"))
    finished = sum(metric(scrape, "vllm:request_success_total", finished_reason=r) for r in ("stop", "length"))
    assert finished == 3 and metric(scrape, "vllm:request_success_total", finished_reason="abort") == 0
    assert metric(scrape, "vllm:num_requests_running") == metric(scrape, "kev_questions_running") == 0
    assert metric(scrape, "vllm:kv_cache_usage_perc") == metric(scrape, "kev_kv_cache_usage_ratio")
    # This server runs on a CPU: its KV cache is in CPU memory; nothing is ever swapped.
    assert metric(scrape, "vllm:cpu_cache_usage_perc") == metric(scrape, "vllm:kv_cache_usage_perc")
    assert metric(scrape, "vllm:num_requests_swapped") == 0
    assert metric(scrape, "vllm:request_max_num_generation_tokens_count") == 3
    assert metric(scrape, "vllm:request_max_num_generation_tokens_sum") == 8 + 8 + 3


def test_a_prompt_over_the_context_is_a_reject_not_an_isolation_alert(server: ServerProcess, client_for) -> None:
    client = client_for(server)
    reply = client.post("/v1/completions", json={"model": NAME, "prompt": "word " * 2000, "max_tokens": 3})
    assert reply.status_code == 400 and "max_context" in reply.json()["error"]["message"]
    scrape = client.get("/metrics").text
    assert metric(scrape, "kev_rejects_total", reason="context_overflow") == 1
    assert 'kind="context_overflow"' not in scrape
