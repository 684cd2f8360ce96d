"""64 concurrent clients against one server: nothing lost, nothing duplicated, no 5xx, every answer equal to its
solo answer."""
from __future__ import annotations

import asyncio

import pytest
from harness import ServerProcess
from load_driver import SERVER_CONFIG, measure

pytestmark = [pytest.mark.service, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(start_server) -> ServerProcess:
    return start_server(SERVER_CONFIG)


def test_64_clients_get_their_solo_answers(server: ServerProcess) -> None:
    report = asyncio.run(measure(server.url, server.headers, clients=64, requests_per_client=3, max_tokens=8,
                                 budget_s=1200))
    assert report.requests == 64 * 3
    assert dict(report.statuses) == {200: 64 * 3}, report.statuses
    assert report.lost == 0 and report.duplicated == 0
    assert report.mismatches == [], report.mismatches[:5]
    assert report.questions == report.expected and report.truncated == 0
    print(f"load: {report.requests / report.wall_s:.2f} requests/s, p50 {report.percentile_ms(0.5):.0f} ms, "
          f"p99 {report.percentile_ms(0.99):.0f} ms, peak RSS {server.peak_rss_mib():.0f} MiB")
