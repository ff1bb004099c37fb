"""Meta's latency in the fake, and reads built for it: sized ranges, read side by side."""

from __future__ import annotations

import threading
from datetime import date, timedelta

import httpx
import pytest

from rastro_assets.meta.client import MetaClient
from rastro_assets.meta.errors import ErrorKind, MetaError
from rastro_assets.meta.insights import RANGE_CONCURRENCY, TARGET_ROWS_PER_RANGE
from rastro_assets.meta.models import InsightsChunk
from rastro_assets_tests.insight_rows import chunk_rows
from rastro_assets_tests.meta.conftest import BASE_URL, BRL, TOKEN, ClientFactory, truth_rows
from rastro_fake_graph import FakeGraphTransport, FakeWorld, serve

SINCE, UNTIL = date(2026, 2, 1), date(2026, 3, 2)
BIG = "act_2077"


class ExchangeLog(httpx.BaseTransport):
    """The fake in-process, noting each insights answer's HTTP status in order."""

    def __init__(self, world: FakeWorld) -> None:
        self.inner = FakeGraphTransport(world)
        self.statuses: list[int] = []
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        with self._lock:
            self.statuses.append(response.status_code)
        return response


class RefusalCounter(httpx.BaseTransport):
    """The fake in-process, noting which requests Meta refused as too much data."""

    def __init__(self, world: FakeWorld) -> None:
        self.inner = FakeGraphTransport(world)
        self.refused: list[bool] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if "/insights" in request.url.path:
            self.refused.append(b"reduce the amount of data" in response.read())
        return response


def socket_client(base_url: str) -> MetaClient:
    return MetaClient(TOKEN, base_url=base_url, sleep=lambda seconds: None)


def busiest_day(world: FakeWorld, account: str, since: date, until: date) -> int:
    days = (until - since).days + 1
    return max(len(world.truth(account, since + timedelta(days=n))) for n in range(days))


def rows_of(chunks: list[InsightsChunk]) -> set:
    rows = [row for chunk in chunks for row in chunk_rows(chunk)]
    assert len(rows) == len(set(rows)), "an ad-day came back twice"
    return set(rows)


def test_the_loopback_fake_holds_every_answer_back_by_its_delay(world: FakeWorld) -> None:
    waits: list[float] = []
    world.sleep = waits.append
    world.request_delay_seconds = 0.3
    with serve(world) as server, socket_client(server.base_url) as client:
        client.check_token()
        list(client.insights(BRL, SINCE, SINCE + timedelta(days=2)))
    assert waits == [0.3] * sum(world.calls.values())
    assert len(waits) >= 2


def test_the_loopback_fake_answers_at_once_by_default(world: FakeWorld) -> None:
    waits: list[float] = []
    world.sleep = waits.append
    with serve(world) as server, socket_client(server.base_url) as client:
        client.check_token()
    assert waits == []


def test_an_async_report_runs_for_its_duration(world: FakeWorld, client_for: ClientFactory):
    world.row_cap = 3  # every day is too much for a synchronous request
    world.async_report_seconds = 40
    elapsed = [0.0]
    world.monotonic = lambda: elapsed[0]

    def wait(seconds: float) -> None:
        elapsed[0] += seconds

    client = client_for(sleep=wait, async_poll_seconds=5)
    [chunk] = list(client.insights(BRL, SINCE, SINCE))
    assert chunk.complete and set(chunk_rows(chunk)) == set(world.truth(BRL, SINCE))
    # Not started, then running until 40 s have passed, polled every 5 s.
    assert elapsed[0] == 40
    assert world.calls["report"] == 9


def test_ranges_sized_from_a_known_rate_are_never_refused(world: FakeWorld) -> None:
    world.add_account(BIG, timezone="America/Sao_Paulo", currency="BRL", n_ads=400,
                      token=TOKEN, first_day=date(2026, 1, 1))
    until = SINCE + timedelta(days=9)
    rate = busiest_day(world, BIG, SINCE, until)
    assert TARGET_ROWS_PER_RANGE // rate < 10 < world.row_cap // rate
    counter = RefusalCounter(world)
    with MetaClient(TOKEN, base_url=BASE_URL, transport=counter,
                    sleep=lambda seconds: None) as client:
        chunks = list(client.insights(BIG, SINCE, until, rows_per_day=rate))
    assert not any(counter.refused)
    assert len(chunks) > 1 and all(chunk.complete for chunk in chunks)
    assert rows_of(chunks) == truth_rows(world, BIG, SINCE, until)


@pytest.mark.parametrize("known", [True, False])
def test_a_read_is_refused_at_most_once(world: FakeWorld, known: bool) -> None:
    """Under a cap below what a sized range aims at, or with nothing known of the
    account, the first request may be refused; what it teaches sizes every later one."""
    rate = busiest_day(world, BRL, SINCE, UNTIL)
    world.row_cap = 3 * rate
    counter = RefusalCounter(world)
    with MetaClient(TOKEN, base_url=BASE_URL, transport=counter,
                    sleep=lambda seconds: None, page_size=10) as client:
        chunks = list(client.insights(BRL, SINCE, UNTIL, rows_per_day=rate if known else None))
    assert counter.refused[0] and not any(counter.refused[1:])
    assert all(chunk.complete for chunk in chunks)
    assert rows_of(chunks) == truth_rows(world, BRL, SINCE, UNTIL)


def test_ranges_read_side_by_side_answer_as_one_at_a_time(
    world: FakeWorld, client_for: ClientFactory
) -> None:
    rate = busiest_day(world, BRL, SINCE, UNTIL)
    answers = []
    for concurrency in (RANGE_CONCURRENCY, 1):
        client = client_for(page_size=5, range_rows=2 * rate, range_concurrency=concurrency)
        chunks = list(client.insights(BRL, SINCE, UNTIL, rows_per_day=rate))
        answers.append(([(c.since, c.until, c.complete) for c in chunks], rows_of(chunks)))
    assert answers[0] == answers[1]
    assert len(answers[0][0]) == 15
    assert answers[0][1] == truth_rows(world, BRL, SINCE, UNTIL)


def test_a_throttle_in_one_range_stops_the_others(world: FakeWorld) -> None:
    rate = busiest_day(world, BRL, SINCE, UNTIL)
    world.fail("insights_page", "throttled", skip=20)
    log = ExchangeLog(world)
    # Two ranges at once, so some finish whole before the throttle lands.
    with MetaClient(TOKEN, base_url=BASE_URL, transport=log, sleep=lambda seconds: None,
                    page_size=3, range_rows=rate, range_concurrency=2) as client:
        chunks = []
        with pytest.raises(MetaError) as caught:
            for chunk in client.insights(BRL, SINCE, UNTIL, rows_per_day=rate):
                chunks.append(chunk)
    assert caught.value.kind is ErrorKind.THROTTLED
    throttled_at = log.statuses.index(400)
    # Each range in flight asks for at most one more page; no later range starts.
    assert len(log.statuses) - 1 - throttled_at <= 2
    assert len(log.statuses) < 50
    assert chunks and all(chunk.complete for chunk in chunks)
    assert rows_of(chunks) == {
        row for chunk in chunks for row in truth_rows(world, BRL, chunk.since, chunk.until)
    }
    assert sum((c.until - c.since).days + 1 for c in chunks) < (UNTIL - SINCE).days + 1
