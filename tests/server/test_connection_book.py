"""ConnectionBook's rules without sockets: the cap per client address, the reserve (eviction of the longest
waiting), and deadlines that tighten as the server fills."""
from __future__ import annotations

import pytest

from kev.server.connection_book import ConnectionBook


class Connection:
    def __init__(self) -> None:
        self.evicted = False

    def evict(self) -> None:
        self.evicted = True


def test_one_address_holds_at_most_its_cap_a_whole_request_takes_a_tricklers_place() -> None:
    book = ConnectionBook(max_connections=10, max_per_client=3, reserve=2)
    flood = [Connection() for _ in range(5)]
    answers = [book.admit(c, "10.0.0.2") for c in flood]
    assert answers[:3] == [None] * 3 and all("max_connections_per_client=3" in a for a in answers[3:] if a)
    assert book.admit(Connection(), "10.0.0.1") is None
    real = Connection()
    assert book.admit(real, "10.0.0.2") is not None  # over the cap: refused unless its first bytes are a request
    assert book.admit_complete(real, "10.0.0.2") is None, "a whole request from the same address gets in"
    assert [c.evicted for c in flood[:3]] == [True, False, False] and book.per_client["10.0.0.2"] == 3
    for c in flood[1:3]:
        book.sent_request(c)
    last = Connection()
    assert book.admit(last, "10.0.0.2") is not None
    refused = book.admit_complete(last, "10.0.0.2")  # every connection there has sent a request: none to evict
    assert refused and "max_connections_per_client=3" in refused
    book.close(flood[1])
    assert book.admit(Connection(), "10.0.0.2") is None, "a closed connection frees its address's slot"


def test_a_trusted_proxy_has_no_per_address_cap() -> None:
    book = ConnectionBook(max_connections=10, max_per_client=1, reserve=2, proxies=frozenset({"10.0.0.9"}))
    behind = [Connection() for _ in range(4)]
    assert [book.admit(c, "10.0.0.9") for c in behind] == [None] * 4 and not any(c.evicted for c in behind)


def test_connections_without_a_whole_request_leave_the_reserve_free() -> None:
    book = ConnectionBook(max_connections=6, max_per_client=100, reserve=2)
    stalled = [Connection() for _ in range(4)]
    for c in stalled:
        assert book.admit(c, "a") is None
    real = Connection()
    assert book.admit(real, "b") is None  # 4 waiting already: the longest waiting makes room
    assert [c.evicted for c in stalled] == [True, False, False, False]
    book.sent_request(real)
    more = [Connection() for _ in range(3)]
    for c in more:
        assert book.admit(c, "a") is None
    assert not real.evicted, "a connection that sent a whole request is never evicted"
    assert sum(c.evicted for c in stalled + more) == 3 and len(book.clients) == 5  # 4 waiting + the real one


def test_the_server_full_of_real_connections_refuses_the_next() -> None:
    book = ConnectionBook(max_connections=3, max_per_client=100, reserve=1)
    for _ in range(3):
        c = Connection()
        assert book.admit(c, "a") is None
        book.sent_request(c)
    refused = book.admit(Connection(), "b")
    assert refused is not None and "server.max_connections=3" in refused


@pytest.mark.parametrize(("num_open", "share"), [(0, 1.0), (50, 1.0), (75, 0.55), (100, 0.1)])
def test_deadlines_tighten_once_half_full(num_open: int, share: float) -> None:
    book = ConnectionBook(max_connections=100, max_per_client=1000, reserve=0)
    for _ in range(num_open):
        c = Connection()
        book.admit(c, "a")
        book.sent_request(c)
    assert book.deadline(10.0) == pytest.approx(10.0 * share)
