"""A model Kev cannot run is one line naming the thing and what is supported, exit 2, no traceback, in every command."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kev.cli.main import main
from kev.model.model_config import SUPPORTED_ARCHITECTURES

REPO = Path(__file__).resolve().parents[2]
SUPPORTED = ", ".join(sorted(SUPPORTED_ARCHITECTURES))  # gemma2, llama, mistral, phi3, qwen2, qwen3
LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
         "num_attention_heads": 4}


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gpt2")
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 64, "n_embd": 32}))
    return folder


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("command", [["run", "hi"], ["plan"], ["verify"], ["bench"], ["stress"]])
def test_unsupported_architecture(capsys, gpt2: Path, command: list[str]) -> None:
    err = one_line_error(capsys, [*command, "--model", str(gpt2)])
    assert f"kev {command[0]}: config.json: model_type 'gpt2' is not supported (supported: {SUPPORTED})" in err


def test_missing_weights(capsys, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    err = one_line_error(capsys, ["run", "hi", "--model", str(tmp_path)])
    assert f"{tmp_path}: no *.safetensors weights" in err


def test_unsupported_gguf_tensor_type(capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gguf

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.attention.head_count", 4)
    writer.add_tensor("token_embd.weight", np.zeros((64, 32), dtype=np.int32), raw_dtype=gguf.GGMLQuantizationType.I32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    monkeypatch.setenv("KEV_CACHE_DIR", str(tmp_path / "cache"))
    err = one_line_error(capsys, ["run", "hi", "--model", str(path)])
    assert "GGUF tensor 'token_embd.weight' has type I32" in err and "supported: F32, F16, " in err and "Q8_0" in err


@pytest.mark.service
def test_serve_says_it_in_one_line_and_exits_2(gpt2: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "kev.cli.main", "serve", "--model", str(gpt2), "--port", "0"],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == ("kev serve: config.json: model_type 'gpt2' is not supported "
                                                    f"(supported: {SUPPORTED})")
