"""The OpenAI wire layer: what a body on the wire means to the engine and what the engine's results look like there.

bodies/: the request and response models and the error body; tools/: tool calling; responses/: the Responses API's
body and objects (and the per-tenant store); limits.py: the server's caps on one call; engine_call.py: a chat or
completion body into queries + SamplingParams + options + the reply's shape; openai_format.py: results and stream
events in OpenAI's shapes; answer_errors.py: a failed question as the error the body's caller gets.
Used alike by the live routes (kev/server) and by batch lines (kev/batch); it imports neither.
"""
