"""Small HTTP edge cases of issue 13, point 7, on the app in process (no model loaded: they are answered
before any route needs it)."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

import kev
from kev.cli.main import build_parser
from kev.server.app import build_app


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(build_app(kev.load_config({}), engine_factory=lambda config: None))


def test_options_allow_names_every_method_of_the_path(client: TestClient) -> None:
    response = client.options("/v1/requests/abc")
    assert response.status_code == 405
    assert response.headers["allow"] == "DELETE, GET"  # two routes share the path
    assert client.options("/v1/query").headers["allow"] == "POST"


@pytest.mark.parametrize(("json_text", "field"), [
    ('{"queries": ["a"], "max_tokens": %s}', "max_tokens"),
    ('{"queries": [{"text": "a", "seed": -%s}]}', "queries[0].seed"),
])
def test_an_integer_too_long_to_parse_names_its_field(client: TestClient, json_text: str, field: str) -> None:
    body = json_text % ("9" * 5000)
    response = client.post("/v1/query", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["error"]["field"] == field and "5000 digits" in response.json()["error"]["message"]


def test_serve_help_says_how_to_keep_the_key_out_of_ps(capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "`ps`" in help_text and "set $KEV_API_KEY to keep the key out of it" in help_text
