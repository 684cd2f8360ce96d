"""Fixtures for the cluster tests: a single-mode `kev serve` (the reference every answer must equal) and a
shared cluster (nats-server, aggregator, two workers, a router) used by the modules that do not break it."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.distributed.cluster_harness import Cluster, two_worker_cluster
from harness import ServerProcess

# The reference runs the same numerics as the workers (same core settings), in single mode.
SINGLE = {"router": {"strategy": "consistent_hash", "default_max_tokens": 8, "default_timeout_ms": 120_000},
          "core": {"threads": 1}}


@pytest.fixture(scope="package")  # ends with tests/distributed: its servers free their memory for the rest
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    server = ServerProcess(SINGLE, tmp_path_factory.mktemp("kev-single")).start(timeout=600)
    with httpx.Client(base_url=server.url, timeout=300) as client:
        yield client
    server.terminate()


@pytest.fixture(scope="package")  # ends with tests/distributed: its servers free their memory for the rest
def reference(single: httpx.Client) -> Callable[..., list[dict[str, Any]]]:
    """reference(queries, **options): the single-mode results (one request, so one packed run)."""

    def answer(queries: list[Any], **options: Any) -> list[dict[str, Any]]:
        response = single.post("/v1/query", json={"queries": queries, **options})
        assert response.status_code == 200, response.text
        return response.json()["results"]

    return answer


@pytest.fixture(scope="package")  # ends with tests/distributed: its servers free their memory for the rest
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with two_worker_cluster(tmp_path_factory.mktemp("kev-cluster")) as cluster:
        yield cluster
