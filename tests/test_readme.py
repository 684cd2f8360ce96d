"""The README's quick tour runs as written from a checkout: its Python blocks (the engine one in a fresh process,
the openai-client ones against a real `kev serve` started from examples/kev.yaml) and its command lines (each
parses as a `kev` command, and every config file it names is shipped)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from harness import REPO, ServerProcess

import kev
from kev.cli.main import build_parser

pytestmark = pytest.mark.service
TOUR = (REPO / "README.md").read_text().split("## Quick tour")[1].split("\n## ")[0]
EXAMPLE = REPO / "examples" / "kev.yaml"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", TOUR, re.DOTALL)


def test_the_example_config_loads_and_the_tour_names_only_shipped_files() -> None:
    config = kev.load_config(str(EXAMPLE))
    assert config.core.model_path == "smollm2-135m-instruct"
    paths = re.findall(r"(?:kev serve --config |from_config\(\")([^\s\")]+)", TOUR)
    assert "examples/kev.yaml" in paths
    for path in paths:
        assert (REPO / path).is_file(), path


def test_every_tour_command_line_parses() -> None:
    lines = "\n".join(blocks("bash")).replace("\\\n", " ").splitlines()
    commands = [line.split("#")[0] for line in lines if line.startswith("kev ") and line != "kev --version"]
    assert len(commands) >= 15
    for command in commands:
        words = shlex.split(re.sub(r"\[[^\]]*\]", "", command))[1:]  # [optional] parts: the bare command
        args, unknown = build_parser().parse_known_args(words)
        assert not unknown, f"{command}: {unknown}"


def test_the_engine_block_runs_in_a_fresh_process() -> None:
    (engine_block,) = [b for b in blocks("python") if "kev.Engine" in b]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", engine_block], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = done.stdout.strip().splitlines()
    assert len(rows) >= 4 and all(re.match(r"\d+ [\d.]+ \d+ ", row) for row in rows[:1])


def test_the_openai_blocks_run_against_kev_serve(start_server: Callable[..., ServerProcess]) -> None:
    config = yaml.safe_load(EXAMPLE.read_text())["kev"]
    server_section = {k: v for k, v in config["server"].items() if k != "port"}  # the harness picks a free port
    server = start_server({**config, "server": server_section, "core": {**config["core"], "kernels": "torch"}})
    namespace: dict[str, Any] = {}
    client_blocks = [b for b in blocks("python") if "client" in b]
    assert len(client_blocks) == 2
    for block in client_blocks:
        exec(block.replace("http://127.0.0.1:8765/v1", f"{server.url}/v1"), namespace)  # noqa: S102
    assert namespace["scored"].choices[0].logprobs.token_logprobs[0] is None  # the echoed prompt, scored
    assert "name" in namespace["person"].choices[0].message.content
