"""Pacing to Meta's limits: one account held only for its own, the app's load slows every
request, the app's throttle pauses them all, abuse is never waited for.

Clients read the fake Graph in-process through one `Pacer` on a pinned clock; their sleeps
are recorded (and move that clock), never slept. `StagedGraph` adds Meta's latency, stages
the app's load, an account's usage and the app's throttle on the fake's answers, and counts
the requests in flight.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import date, timedelta

import httpx
import pytest

from rastro_assets.meta.client import MetaClient
from rastro_assets.meta.errors import ErrorKind, MetaError
from rastro_assets.meta.limits import RateLimit
from rastro_assets.meta.models import InsightsChunk
from rastro_assets.meta.pacing import Attempt, Pacer, default_pacer
from rastro_assets_tests.insight_rows import chunk_rows
from rastro_assets_tests.meta.conftest import BASE_URL, FIRST_DAY, INSTANT, TOKEN, truth_rows
from rastro_fake_graph import FakeGraphTransport, FakeWorld, MutableClock

SINCE, UNTIL = date(2026, 3, 2), date(2026, 3, 6)
# Meta answers in about this long: enough for the readers' requests to overlap.
LATENCY_SECONDS = 0.01
APP_THROTTLE = {"message": "(#4) User request limit reached", "type": "OAuthException",
                "code": 4, "error_subcode": 1504022, "fbtrace_id": "Atrace"}


class PinnedClock:
    """The pacer's monotonic clock: still, but for the sleeps it is told of."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


class StagedGraph(httpx.BaseTransport):
    """The fake Graph with Meta's latency; the app's load, an account's usage and the app's
    throttle staged on its answers; the Graph requests in flight counted."""

    def __init__(self, world: FakeWorld, *, latency: float = 0.0,
                 clock: PinnedClock | None = None) -> None:
        self.inner = FakeGraphTransport(world)
        self.latency = latency
        self.clock = clock
        self.app_pct: float | None = None
        self.account_usage: dict[str, dict] = {}
        self.app_throttles = 0  # the next this many requests are refused for the app's load
        self.overloaded_until = -1.0  # on `clock`: until then, every request is refused so
        self.calls = 0
        self.by_account: defaultdict[str, int] = defaultdict(int)
        self.throttles = 0
        self.in_flight = 0
        self.peak = 0
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        segments = request.url.path.split("/")
        account = segments[2] if len(segments) > 2 else ""
        with self._lock:
            self.calls += 1
            self.by_account[account] += 1
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            refused = self.app_throttles > 0 or (
                self.clock is not None and self.clock() < self.overloaded_until)
            self.app_throttles -= refused and self.app_throttles > 0
            self.throttles += refused
        try:
            if self.latency:
                time.sleep(self.latency)  # Meta's latency, so that requests overlap
            if refused:
                return httpx.Response(400, json={"error": APP_THROTTLE}, headers={
                    "X-FB-Ads-Insights-Throttle": json.dumps(
                        {"app_id_util_pct": 100, "acc_id_util_pct": 3})})
            response = self.inner.handle_request(request)
            if self.app_pct is not None:
                response.headers["X-App-Usage"] = json.dumps({"call_count": self.app_pct})
                response.headers["X-FB-Ads-Insights-Throttle"] = json.dumps(
                    {"app_id_util_pct": self.app_pct, "acc_id_util_pct": 1})
            if account in self.account_usage:
                response.headers["X-Business-Use-Case-Usage"] = json.dumps(
                    {"1": [self.account_usage[account]]})
                response.headers["X-Ad-Account-Usage"] = json.dumps(
                    {"acc_id_util_pct": 2, "reset_time_duration": 0})
            return response
        finally:
            with self._lock:
                self.in_flight -= 1

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.in_flight


def accounts_world(count: int, *, n_ads: int = 3) -> FakeWorld:
    world = FakeWorld(MutableClock(INSTANT), seed=11)
    for number in range(count):
        world.add_account(f"act_{3001 + number}", timezone="UTC", currency="USD",
                          n_ads=n_ads, token=TOKEN, first_day=FIRST_DAY)
    return world


class Readers:
    """One client per account, all through `pacer`; each client's sleeps kept by account."""

    def __init__(self, transport: httpx.BaseTransport, pacer: Pacer, clock: PinnedClock, *,
                 clock_moves: bool = True, page_size: int = 500) -> None:
        self.transport = transport
        self.pacer = pacer
        self.clock = clock
        self.clock_moves = clock_moves
        self.page_size = page_size
        self.sleeps: defaultdict[str, list[float]] = defaultdict(list)
        self._clients: list[MetaClient] = []

    def client(self, account: str) -> MetaClient:
        def sleep(seconds: float) -> None:
            self.sleeps[account].append(seconds)
            if self.clock_moves:
                self.clock.advance(seconds)

        client = MetaClient(TOKEN, base_url=BASE_URL, transport=self.transport, sleep=sleep,
                            pacer=self.pacer, page_size=self.page_size)
        self._clients.append(client)
        return client

    def read(self, account: str) -> list[InsightsChunk]:
        return list(self.client(account).insights(account, SINCE, UNTIL))

    def read_side_by_side(self, accounts: list[str],
                          threads: int = 16) -> dict[str, list[InsightsChunk]]:
        with ThreadPoolExecutor(threads) as pool:
            return dict(zip(accounts, pool.map(self.read, accounts), strict=True))

    def close(self) -> None:
        for client in self._clients:
            client.close()


@pytest.fixture
def clock() -> PinnedClock:
    return PinnedClock()


@pytest.fixture
def pacer(clock: PinnedClock) -> Pacer:
    return Pacer(monotonic=clock, rng=random.Random(5))


@pytest.fixture
def readers_for(pacer: Pacer, clock: PinnedClock) -> Iterator[Callable[..., Readers]]:
    made: list[Readers] = []

    def build(transport: httpx.BaseTransport, **kwargs) -> Readers:
        made.append(Readers(transport, pacer, clock, **kwargs))
        return made[-1]

    yield build
    for readers in made:
        readers.close()


def assert_jittered(waits: list[float], bases: list[float]) -> None:
    """Each wait is its base lengthened by at most a fifth, never shortened."""
    assert len(waits) == len(bases), waits
    for wait, base in zip(waits, bases, strict=True):
        assert base < wait <= base * 1.2, (waits, bases)


def assert_complete(world: FakeWorld, read: dict[str, list[InsightsChunk]]) -> None:
    for account, chunks in read.items():
        assert all(chunk.complete for chunk in chunks), account
        rows = {row for chunk in chunks for row in chunk_rows(chunk)}
        assert rows == truth_rows(world, account, SINCE, UNTIL), account


def test_one_account_at_its_own_limit_waits_its_regain_time_and_the_other_49_never_wait(
    readers_for, pacer: Pacer
) -> None:
    world = accounts_world(50)
    accounts = sorted(world.accounts)
    held = accounts[17]
    world.fail("insights", "throttled_80000", account=held, regain_minutes=2)
    readers = readers_for(FakeGraphTransport(world))

    read = readers.read_side_by_side(accounts)

    assert_complete(world, read)
    assert_jittered(readers.sleeps.pop(held), [120])  # max(regain, reset, 60 s), jittered
    assert not any(readers.sleeps.values()), dict(readers.sleeps)
    assert world.calls["insights"] == 51  # the refused request was sent once more


def test_an_accounts_hold_is_waited_by_every_session_reading_it_and_by_no_other(
    readers_for, pacer: Pacer
) -> None:
    world = accounts_world(3)
    held, other, _ = sorted(world.accounts)
    world.fail("insights", "throttled_80000", account=held, regain_minutes=3)
    readers = readers_for(FakeGraphTransport(world), clock_moves=False)

    readers.read(held)
    assert_jittered(readers.sleeps[held], [180])
    [waited] = readers.sleeps[held]
    hold = pacer.ahead(held)
    assert hold is not None and hold.limit == RateLimit.ADS_INSIGHTS

    list(readers.client(held).ads(held))  # the catalog read after the spend, its own session
    assert readers.sleeps[held] == [waited, waited]
    list(readers.client(other).ads(other))
    readers.read(other)
    assert pacer.ahead(other) is None and readers.sleeps[other] == []


def test_an_answer_near_the_accounts_own_limit_holds_it_briefly_or_ends_its_read(
    readers_for, pacer: Pacer, clock: PinnedClock
) -> None:
    world = accounts_world(2, n_ads=6)
    near, calm = sorted(world.accounts)
    graph = StagedGraph(world)
    graph.account_usage[near] = {"type": "ads_insights", "call_count": 93, "total_time": 40,
                                 "estimated_time_to_regain_access": 1}
    readers = readers_for(graph, page_size=5)

    read = readers.read_side_by_side([near, calm])
    assert_complete(world, read)
    pages = graph.by_account[near]
    assert pages > 3
    # Each answer at 93 % holds the account a minute or so; its next page waits it.
    assert_jittered(readers.sleeps[near], [60] * (pages - 1))
    assert readers.sleeps[calm] == []

    graph.account_usage[near] = {"type": "ads_insights", "call_count": 97,
                                 "estimated_time_to_regain_access": 45}
    clock.advance(3600)
    with pytest.raises(MetaError) as caught:
        readers.read(near)
    assert (caught.value.kind, caught.value.limit) == (ErrorKind.THROTTLED, RateLimit.ADS_INSIGHTS)
    assert caught.value.regain_seconds == 45 * 60
    assert graph.by_account[near] == pages + 1  # the first page told; no other was asked
    assert pacer.ahead(near) is None  # a hold of 45 minutes is the planner's, not the process's


def test_at_90_percent_of_the_apps_load_fewer_requests_are_in_flight_and_none_is_held(
    readers_for, pacer: Pacer
) -> None:
    world = accounts_world(8, n_ads=6)
    accounts = sorted(world.accounts)
    graph = StagedGraph(world, latency=LATENCY_SECONDS)
    readers = readers_for(graph, page_size=2)

    graph.app_pct = 40
    readers.read_side_by_side(accounts, threads=8)
    unpaced = graph.peak
    assert unpaced >= 5
    assert pacer.allowed_in_flight() is None

    graph.app_pct = 90
    readers.client(accounts[0]).account(accounts[0])  # an answer says the load
    allowed = pacer.allowed_in_flight()
    assert allowed is not None and allowed <= 1 + int((8 - 1) * 0.4)
    graph.reset_peak()
    assert_complete(world, readers.read_side_by_side(accounts, threads=8))
    assert graph.peak <= allowed < unpaced
    assert not any(readers.sleeps.values())
    assert all(pacer.ahead(account) is None for account in accounts)

    graph.app_pct = 30  # the load falls: as many in flight as before
    readers.client(accounts[0]).account(accounts[0])
    graph.reset_peak()
    readers.read_side_by_side(accounts, threads=8)
    assert graph.peak > allowed


def test_the_in_flight_limit_shrinks_linearly_with_the_load_and_forgets_old_readings(
    pacer: Pacer, clock: PinnedClock
) -> None:
    with ExitStack() as stack:
        for _ in range(9):
            stack.enter_context(pacer.slot("token-a", None, Attempt()))
        stack.enter_context(pacer.slot("token-b", None, Attempt()))
    expected = {0: None, 74.9: None, 75: 10, 80: 8, 90: 4, 99: 1, 100: 1, 140: 1}
    for load, allowed in expected.items():
        pacer.read_app_load(load)
        assert pacer.allowed_in_flight() == allowed, load
    pacer.read_app_load(90)
    assert (pacer.allowed_in_flight("token-a"), pacer.allowed_in_flight("token-b")) == (4, 1)
    clock.advance(31)  # Meta measures the load per second: an old reading says nothing
    assert pacer.allowed_in_flight() is None
    pacer.read_app_load(None, 95)  # the platform's calls an hour bind only platform calls
    assert (pacer.allowed_in_flight(), pacer.allowed_in_flight(platform=True)) == (None, 2)


def test_the_apps_throttle_pauses_every_request_with_a_growing_back_off_then_resumes(
    readers_for, pacer: Pacer, clock: PinnedClock
) -> None:
    world = accounts_world(3)
    first, second, third = sorted(world.accounts)
    graph = StagedGraph(world)
    readers = readers_for(graph, clock_moves=False)

    graph.app_throttles = 3
    read = {first: readers.read(first)}
    pauses = readers.sleeps[first]
    assert_jittered(pauses, [60, 120, 240])
    assert graph.throttles == 3

    read[second] = readers.read(second)  # still paused: another account's request waits too
    assert readers.sleeps[second] == [pauses[-1]]
    ahead = pacer.ahead(None)
    assert ahead is not None and ahead.app and ahead.limit == RateLimit.APP_INSIGHTS_LOAD

    clock.advance(600)
    graph.app_throttles = 1  # a good answer since: the back-off starts over at a minute
    read[third] = readers.read(third)
    assert_jittered(readers.sleeps[third], [60])
    assert_complete(world, read)


def test_the_apps_throttle_is_waited_at_most_so_long_then_the_read_ends_throttled(
    readers_for, clock: PinnedClock
) -> None:
    world = accounts_world(1)
    [account] = world.accounts
    graph = StagedGraph(world)
    graph.app_throttles = 100
    readers = readers_for(graph)
    with pytest.raises(MetaError) as caught:
        readers.read(account)
    assert (caught.value.kind, caught.value.limit) == (
        ErrorKind.THROTTLED, RateLimit.APP_INSIGHTS_LOAD)
    assert_jittered(readers.sleeps[account], [60, 120, 240, 480, 900])
    assert graph.throttles == 6


def test_the_apps_throttle_is_waited_no_longer_than_the_reads_own_deadline(
    readers_for,
) -> None:
    world = accounts_world(2)
    graph = StagedGraph(world)
    graph.app_throttles = 100
    readers = readers_for(graph, clock_moves=False)
    with pytest.raises(MetaError) as caught:
        readers.client("listing").reachable_accounts()  # a listing has 300 s in all
    assert (caught.value.kind, caught.value.limit) == (
        ErrorKind.THROTTLED, RateLimit.APP_INSIGHTS_LOAD)
    # The sleeps are not slept: the 8-minute pause alone would end past the 300 s.
    assert_jittered(readers.sleeps["listing"], [60, 120, 240])
    assert graph.throttles == 4


def test_613_without_a_subcode_is_abuse_and_raised_at_once(readers_for, pacer: Pacer) -> None:
    world = accounts_world(2)
    cut, other = sorted(world.accounts)
    world.fail("insights", "throttled_613", account=cut, regain_minutes=0)
    readers = readers_for(FakeGraphTransport(world))
    with pytest.raises(MetaError) as caught:
        readers.read(cut)
    assert (caught.value.kind, caught.value.code, caught.value.limit) == (
        ErrorKind.THROTTLED, 613, RateLimit.ABUSE)
    assert world.calls["insights"] == 1 and readers.sleeps[cut] == []
    assert pacer.ahead(cut) is None
    assert_complete(world, {other: readers.read(other)})


def test_an_overloaded_app_meets_few_throttle_errors(
    readers_for, clock: PinnedClock
) -> None:
    world = accounts_world(16, n_ads=4)
    accounts = sorted(world.accounts)
    graph = StagedGraph(world, latency=LATENCY_SECONDS / 2, clock=clock)
    graph.overloaded_until = clock() + 100  # Meta refuses every request for 100 s
    readers = readers_for(graph, page_size=2)

    read = readers.read_side_by_side(accounts, threads=8)

    assert_complete(world, read)
    assert graph.throttles <= 8 + 2  # those in flight when it began, and a retry or two
    assert graph.throttles / graph.calls < 0.1


def test_a_forked_child_paces_with_a_pacer_of_its_own() -> None:
    parent = default_pacer()
    parent.read_app_load(95)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's verdict is its exit status
        fresh = default_pacer()
        os._exit(0 if fresh is not parent and fresh.allowed_in_flight() is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert default_pacer() is parent


def test_a_syncs_outcome_names_the_limit_that_refused_it(syncer, linked_world, now) -> None:
    from rastro_assets.sync.types import SyncRequest

    until = date(2026, 11, 30)
    since = until - timedelta(days=6)
    linked_world.fail("insights", "throttled", account="act_101", regain_minutes=90)
    wave = syncer.sync_wave(
        [SyncRequest("act_101", since, until, kind="daily", run_id="w1"),
         SyncRequest("act_202", since, until, kind="daily", run_id="w1")],
        synced_at=now, concurrency=2,
    )
    outcomes = {outcome.request.ad_account_id: outcome for outcome in wave.outcomes}
    assert (outcomes["act_101"].outcome, outcomes["act_101"].rate_limit) == (
        "throttled", RateLimit.ADS_INSIGHTS)
    assert (outcomes["act_202"].outcome, outcomes["act_202"].rate_limit) == ("ok", None)

    linked_world.fail("ads", "throttled_17", account="act_202", regain_minutes=90)
    catalog = syncer.catalog.sync_catalog("act_202", full=True, run_id="c1")
    assert (catalog.outcome, catalog.rate_limit) == ("throttled", RateLimit.AD_ACCOUNT_SCORE)
