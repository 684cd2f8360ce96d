"""GGUF -> HF folder conversion, the model store and the tokenizer, checked against transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kev.model.model_store import ALIASES, ModelNotFoundError, resolve_model_path
from kev.model.tokenizer import Tokenizer

ALIAS = "smollm2-135m-instruct"
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

# Mixed scripts, digits, emoji, whitespace runs, and special tokens written in the text.
TEXTS = [
    "Hello, world!",
    "Kev的隔离通道是如何实现的",
    "x = 12345",
    "def f(x):\n    return x**2 + 3.14159",
    "emoji 🚀🔥 and 👩\u200d💻 zwj",
    "   lead   trail   ",
    "\t\ttabs\n\n\nnewlines  ",
    "I'm sure they'll say it's 2nd, not 1st.",
    "<|im_start|>user\nhi<|im_end|>\n",
    "Ünïcödé — naïve café, Привет мир, مرحبا",
]


@pytest.fixture(scope="module")
def folder() -> Path:
    return resolve_model_path(ALIAS)


@pytest.fixture(scope="module")
def tok(folder: Path) -> Tokenizer:
    return Tokenizer.from_folder(folder)


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    import importlib.util

    spec = importlib.util.find_spec(ALIASES[ALIAS].package)
    assert spec is not None and spec.submodule_search_locations
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


@pytest.fixture(scope="module")
def hf_tok(gguf_file: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)


def test_alias_resolves_to_complete_cached_folder(folder: Path) -> None:
    assert all((folder / name).is_file() for name in FILES)
    inode = (folder / "model.safetensors").stat().st_ino
    again = resolve_model_path(ALIAS)  # checked against its manifest, not converted again
    assert again == folder and (folder / "model.safetensors").stat().st_ino == inode
    assert resolve_model_path(str(folder)) == folder  # an HF folder resolves to itself


def test_config_values(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 30
    assert config["hidden_size"] == 576
    assert config["num_attention_heads"] == 9
    assert config["num_key_value_heads"] == 3
    assert config["head_dim"] == 64
    assert config["vocab_size"] == 49152
    assert config["rope_theta"] == 1e5
    assert config["tie_word_embeddings"] is True
    assert config["eos_token_id"] == 2


def test_encode_matches_transformers(tok: Tokenizer, hf_tok) -> None:
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == hf_tok.encode(text, add_special_tokens=False), text
        assert tok.decode(ids, skip_special_tokens=False) == text


def test_digits_split_before_byte_level(tok: Tokenizer) -> None:
    # HF SmolLM2 (and llama.cpp "smollm") split digits out first, so a space run before a digit
    # stays one token. transformers' GGUF tokenizer lacks that step and gives "ĠĠ","Ġ" here.
    assert tok.encode("a   5") == [tok.token_to_id("a"), tok.token_to_id("ĠĠĠ"), tok.token_to_id("5")]


def test_special_tokens_and_eos(tok: Tokenizer) -> None:
    assert tok.encode("<|im_end|>") == [2]
    assert tok.decode([1, 104, 2]) == "x"
    assert tok.eos_token_ids == [2]


def test_chat_template_matches_transformers(tok: Tokenizer, hf_tok) -> None:
    messages = [{"role": "user", "content": "hi"}]
    assert tok.has_chat_template
    expected = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.render_chat(messages) == expected
    assert tok.render_chat(messages, add_generation_prompt=False).endswith("hi<|im_end|>\n")


def test_incremental_decoder_never_splits_characters(tok: Tokenizer) -> None:
    ids = tok.encode("Kev的隔离通道是如何实现的 🚀 ok 👩\u200d💻!")
    decoder = tok.incremental_decoder()
    deltas = [decoder.push(i) for i in ids]
    assert "\ufffd" not in "".join(deltas)
    assert "" in deltas  # some characters do span several tokens
    assert "".join(deltas) + decoder.flush() == tok.decode(ids)


def test_incremental_decoder_flushes_partial_character(tok: Tokenizer) -> None:
    ids = tok.encode("ok 🚀")[:-1]  # cut inside the emoji's bytes
    decoder = tok.incremental_decoder()
    text = "".join(decoder.push(i) for i in ids)
    assert text + decoder.flush() == tok.decode(ids)


def test_unknown_alias_raises() -> None:
    with pytest.raises(ModelNotFoundError, match="no-such-model") as err:
        resolve_model_path("no-such-model")
    assert ALIAS in str(err.value)
    assert isinstance(err.value, ValueError)


@pytest.mark.slow
def test_weights_bit_equal_to_transformers_gguf_loader(folder: Path, gguf_file: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    # from_pretrained(gguf_file=...) insists on accelerate (not installed), but its weights come
    # from load_gguf_checkpoint, so call that with the same meta-device model for name mapping.
    config = transformers.AutoConfig.from_pretrained(str(folder))
    with torch.device("meta"):
        skeleton = transformers.AutoModelForCausalLM.from_config(config)
    theirs = load_gguf_checkpoint(str(gguf_file), return_tensors=True, model_to_load=skeleton)["tensors"]
    ours = load_file(str(folder / "model.safetensors"))
    names = ["model.embed_tokens.weight", "model.norm.weight"] + [
        f"model.layers.{n}.{part}.weight"
        for n in (0, 29)
        for part in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.down_proj", "input_layernorm")
    ]
    for name in names:
        assert torch.equal(ours[name], theirs[name].to(torch.float32)), name
    assert set(ours) == set(theirs) - {"lm_head.weight"}
    assert "lm_head.weight" not in ours


@pytest.mark.slow
def test_converted_folder_generates_sensible_text(folder: Path, tok: Tokenizer) -> None:
    # Independent of transformers' GGUF code: a wrong Q/K un-permutation would garble this.
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    prompt = tok.render_chat([{"role": "user", "content": "What is the capital of France?"}])
    ids = torch.tensor([tok.encode(prompt)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=20, do_sample=False, eos_token_id=tok.eos_token_ids)
    assert "Paris" in tok.decode(out[0, ids.shape[1] :].tolist())
