"""OpenAI's Responses API (POST /v1/responses, GET / DELETE /v1/responses/{id}) on Kev's chat path.

body.py: a Responses body into the chat completion body it means (input items, instructions, text.format, tools,
tool_choice, previous_response_id's conversation); objects.py: a chat completion into the Response object and the
chat stream chunks into the Responses stream events; store.py: stored responses, per tenant. The route
(kev/server/routes_responses.py) runs the chat body exactly as /v1/chat/completions runs it: one question, one
channel, bit-identical to the same question asked alone.
"""
