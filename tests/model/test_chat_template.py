"""Chat templates where transformers finds them (chat_template.jinja, tokenizer_config.json, chat_template.json), the
core.chat_template / --chat-template override, and a warning for an instruct model without one."""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

import kev
from kev.errors import ConfigError
from kev.model.model_store import resolve_model_path
from kev.model.tokenizer import Tokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
TINY = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture(scope="module")
def default_folder() -> Path:
    return resolve_model_path("smollm2-135m-instruct")


@pytest.fixture
def folder(default_folder: Path, tmp_path: Path) -> Path:
    """The default model's tokenizer files, its chat template moved out of tokenizer_config.json."""
    shutil.copy(default_folder / "tokenizer.json", tmp_path)
    config = json.loads((default_folder / "tokenizer_config.json").read_text())
    (tmp_path / "template.jinja").write_text(config.pop("chat_template"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_chat_template_jinja_renders_as_transformers_does(folder: Path) -> None:
    from transformers import AutoTokenizer

    assert not Tokenizer.from_folder(folder).has_chat_template
    shutil.copy(folder / "template.jinja", folder / "chat_template.jinja")
    reference = AutoTokenizer.from_pretrained(folder)
    expected = reference.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert Tokenizer.from_folder(folder).render_chat(MESSAGES) == expected


def test_jinja_file_wins_over_tokenizer_config_and_json_is_the_last_resort(folder: Path) -> None:
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": TINY}))
    assert Tokenizer.from_folder(folder).render_chat(MESSAGES) == "<system>Be brief.<user>What is 2+2?<assistant>"
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TINY.replace("<", "[")}))
    assert Tokenizer.from_folder(folder).render_chat(MESSAGES).startswith("[system>")
    (folder / "chat_template.jinja").write_text(TINY.replace("<", "("))
    assert Tokenizer.from_folder(folder).render_chat(MESSAGES).startswith("(system>")


def test_override_is_a_file_or_the_template_itself(folder: Path) -> None:
    assert Tokenizer.from_folder(folder, TINY).render_chat(MESSAGES).endswith("<assistant>")
    (folder / "mine.jinja").write_text(TINY.replace("<", "{{ '|' }}"))
    assert Tokenizer.from_folder(folder, str(folder / "mine.jinja")).render_chat(MESSAGES).startswith("|system>")
    with pytest.raises(ConfigError, match=r"core.chat_template: '/nonexistent/t.jinja' is neither a readable file"):
        Tokenizer.from_folder(folder, "/nonexistent/t.jinja")


def test_instruct_model_without_template_warns_and_override_fixes_it(default_folder: Path, tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    from kev.engine.engine_setup import load_model_and_tokenizer

    bare = tmp_path / "tiny-instruct"
    bare.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (bare / name).symlink_to(default_folder / name)
    config = json.loads((default_folder / "tokenizer_config.json").read_text())
    config.pop("chat_template")
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING, logger="kev.engine"):
        _, tokenizer = load_model_and_tokenizer(kev.load_config({"core": {"model_path": str(bare)}}))
    assert not tokenizer.has_chat_template
    assert "looks like an instruct model but has no chat template" in caplog.text and "--chat-template" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kev.engine"):
        config = kev.load_config({"core": {"model_path": str(bare), "chat_template": TINY}})
        _, tokenizer = load_model_and_tokenizer(config)
    assert tokenizer.has_chat_template and "no chat template" not in caplog.text


def test_chat_template_flag_sets_the_config_field() -> None:
    from kev.cli.common import config_from_args
    from kev.cli.main import build_parser

    for command in (["run", "hi"], ["serve"], ["verify"], ["bench"], ["stress"]):
        args = build_parser().parse_args([*command, "--chat-template", TINY])
        assert config_from_args(args).core.chat_template == TINY
