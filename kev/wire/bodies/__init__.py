"""The JSON bodies on the wire (pydantic models of Kev's own API and of OpenAI's) and the one error shape."""
