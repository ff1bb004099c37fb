"""Every read of the Graph is bounded: a listing that pages without end, a body dribbled a
byte at a time and a body without end each stop, over real sockets, with one clear error."""

from __future__ import annotations

import time
import tracemalloc

import pytest

from rastro_assets.meta.bounds import GRAPH_BODY_MAX_BYTES, OutOfBounds, ReadBounds
from rastro_assets.meta.client import ACCOUNT_LISTING_BOUNDS, MetaClient
from rastro_assets.meta.errors import ErrorKind
from rastro_assets_tests.meta.conftest import BRL, TOKEN
from rastro_fake_graph import FakeWorld, serve

# Old code never returns from these: fail in seconds instead of at the suite's timeout.
pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def many(world: FakeWorld) -> FakeWorld:
    for number in range(1, 121):
        world.add_account(f"act_{7000 + number}", timezone="UTC", currency="EUR", n_ads=0,
                          token=TOKEN)
    return world


def socket_client(base_url: str) -> MetaClient:
    return MetaClient(TOKEN, base_url=base_url, page_size=50, sleep=lambda seconds: None)


def test_a_listing_that_pages_without_end_stops_at_its_page_cap(many: FakeWorld):
    many.fail("adaccounts", "endless_paging", times=None)
    requests = many.record_requests()
    with (
        serve(many) as server,
        socket_client(server.base_url) as client,
        pytest.raises(OutOfBounds) as stopped,
    ):
        client.reachable_accounts(ReadBounds(max_pages=12))
    assert str(stopped.value) == "Meta kept paging GET me/adaccounts past 12 pages; stopped"
    assert stopped.value.kind is ErrorKind.OTHER
    assert sum(1 for request in requests if request.endpoint == "adaccounts") == 12


def test_a_body_dribbled_a_byte_at_a_time_stops_at_the_total_deadline(many: FakeWorld):
    many.slow_body_byte_seconds = 0.01
    many.fail("adaccounts", "slow_body", skip=1, times=None)
    started = time.monotonic()
    with (
        serve(many) as server,
        socket_client(server.base_url) as client,
        pytest.raises(OutOfBounds) as stopped,
    ):
        client.reachable_accounts(ReadBounds(max_pages=50, seconds=0.5))
    assert str(stopped.value) == (
        "Meta's answers to GET me/adaccounts took over 0.5s in all; stopped"
    )
    # The first page came whole; the second, a byte every 10 ms, would take a minute.
    assert time.monotonic() - started < 10


def test_a_body_without_end_is_dropped_at_its_cap_in_bounded_memory(many: FakeWorld):
    many.huge_body_bytes = 50 << 20
    many.fail("adaccounts", "huge_body")
    cap = ACCOUNT_LISTING_BOUNDS.max_body_bytes
    tracemalloc.start()
    try:
        with (
            serve(many) as server,
            socket_client(server.base_url) as client,
            pytest.raises(OutOfBounds) as stopped,
        ):
            client.reachable_accounts()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(stopped.value) == (
        f"Meta's answer to GET me/adaccounts is over the {cap:,}-byte cap; not read further"
        " (HTTP 200)"
    )
    assert peak < 3 * cap


def test_every_other_answer_has_the_sessions_cap(many: FakeWorld, client_for):
    many.huge_body_bytes = GRAPH_BODY_MAX_BYTES + (1 << 20)
    many.fail("account", "huge_body")
    with pytest.raises(OutOfBounds, match=f"GET {BRL} is over the {GRAPH_BODY_MAX_BYTES:,}-byte"):
        client_for().account(BRL)
    # Within the caps, the listing reads as before.
    assert len(client_for(page_size=50).reachable_accounts()) == 122


def test_one_answer_dribbled_a_byte_at_a_time_has_twice_the_request_timeout(
    world: FakeWorld, client_for
):
    world.slow_body_byte_seconds = 0.01  # a node of about 200 bytes: two seconds
    world.fail("account", "slow_body")
    started = time.monotonic()
    with pytest.raises(OutOfBounds) as stopped:
        client_for(timeout_seconds=0.2).account(BRL)
    assert str(stopped.value) == f"Meta's answer to GET {BRL} took over 0.4s; stopped"
    assert time.monotonic() - started < 1.5


def test_the_unbounded_answers_are_staged_only_where_a_person_waits(world: FakeWorld):
    for point in ("insights", "ads", "thumbnail"):
        with pytest.raises(ValueError, match="account points"):
            world.fail(point, "slow_body")
