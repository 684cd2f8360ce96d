"""Tool calling on /v1/chat/completions (OpenAI's and vLLM's `tools`, `tool_choice`, `parallel_tool_calls`).

prompt.py: tools and tool-call histories into prompt text (the model's chat template when it
takes tools, else Kev's generic system message); forced.py: the grammar a `required` or named call is generated
under; parsers.py: model output into tool calls (hermes, llama3_json); reply.py: responses and stream deltas.
"""
