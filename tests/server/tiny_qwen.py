"""A tiny random Qwen2 model with a Qwen-style chat template that has a tools slot (written for these tests in
Qwen 2.5's format), on the default model's tokenizer: what tool calling looks like on a model whose template
takes `tools`."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

QWEN_STYLE_TEMPLATE = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}{% else %}You are a helpful assistant.{% endif %}


# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{% for message in messages %}
{% if message.role == 'system' %}
{% elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{% if message.content %}{{ message.content }}
{% endif %}
{% for call in message.tool_calls %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{% endfor %}
{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def build_tiny_qwen(folder: Path, tokenizer_folder: Path) -> Path:
    """Random weights (seeded), 2 layers of width 64, the default model's vocabulary, this template."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                                      eos_token_id=2, bos_token_id=1, tie_word_embeddings=True)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
    shutil.copy(tokenizer_folder / "tokenizer.json", folder)
    tok_config = json.loads((tokenizer_folder / "tokenizer_config.json").read_text())
    tok_config["chat_template"] = QWEN_STYLE_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config))
    return folder
