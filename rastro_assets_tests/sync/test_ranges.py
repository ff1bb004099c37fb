"""Syncs under Meta's latency: ranges sized from the warehouse's history, read side by side."""

from __future__ import annotations

import threading
from datetime import date, timedelta
from decimal import Decimal

import httpx
import pytest

from rastro_assets.meta.client import MetaClient
from rastro_assets.meta.insights import RANGE_CONCURRENCY
from rastro_assets.sync.syncer import Syncer
from rastro_assets.sync.types import SyncRequest
from rastro_assets.timekeeping import days_between
from rastro_assets_tests.truth import assert_equals_truth, stored_rows
from rastro_assets_tests.warehouse.assertions import assert_site_spend_exact
from rastro_fake_graph.app import FakeGraphTransport
from rastro_fake_graph.world import Figures

TODAY = date(2026, 11, 30)  # act_101's local today at the tests' NOW
ACCOUNT = "act_101"


class Exchanges(httpx.BaseTransport):
    """The fake in-process, noting each insights answer in order: ok, refused, failed."""

    def __init__(self, world) -> None:
        self.inner = FakeGraphTransport(world)
        self.answers: list[str] = []
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if "/insights" in request.url.path:
            body = response.read()
            verdict = ("refused" if b"reduce the amount of data" in body
                       else "failed" if response.status_code >= 400 else "ok")
            with self._lock:
                self.answers.append(verdict)
        return response


def syncer_with(warehouse, world, clock, exchanges: Exchanges, **client_options) -> Syncer:
    def client(token: str) -> MetaClient:
        return MetaClient(token, base_url="https://graph.facebook.com/v25.0",
                          transport=exchanges, sleep=lambda seconds: None,
                          async_poll_seconds=0, **({"page_size": 10} | client_options))

    return Syncer(warehouse, client, clock=clock)


def blocks(days: int = 90, size: int = 30) -> list[tuple[date, date]]:
    first = TODAY - timedelta(days=days - 1)
    return [(first + timedelta(days=n), min(TODAY, first + timedelta(days=n + size - 1)))
            for n in range(0, days, size)]


def test_a_backfill_is_refused_at_most_once_a_block(warehouse, linked_world, fake_clock,
                                                    secrets_key):
    """The first request of a block may meet a cap nothing predicted (the first block
    knows nothing of the account; the later ones know its rows per day but not Meta's
    cap); no other request is refused."""
    linked_world.row_cap = 15  # two days of six ads
    exchanges = Exchanges(linked_world)
    syncer = syncer_with(warehouse, linked_world, fake_clock, exchanges)
    refused_firsts = []
    for index, (since, until) in enumerate(blocks()):
        exchanges.answers.clear()
        outcome = syncer.sync(SyncRequest(ACCOUNT, since, until, kind="backfill",
                                          run_id=f"b{index}"))
        assert outcome.ok, outcome.error
        assert "refused" not in exchanges.answers[1:]
        refused_firsts.append(exchanges.answers[0] == "refused")
    assert refused_firsts == [True, True, True]
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, ACCOUNT, blocks()[0][0], TODAY)


def test_history_under_the_cap_reads_a_backfill_block_without_a_refusal(
    warehouse, linked_world, fake_clock, secrets_key
):
    exchanges = Exchanges(linked_world)
    syncer = syncer_with(warehouse, linked_world, fake_clock, exchanges, range_rows=12)
    (first_since, first_until), (since, until), _ = blocks()
    syncer.sync(SyncRequest(ACCOUNT, first_since, first_until, kind="backfill", run_id="b0"))
    linked_world.row_cap = 15  # a sized range (two days of six ads at most) fits
    exchanges.answers.clear()
    outcome = syncer.sync(SyncRequest(ACCOUNT, since, until, kind="backfill", run_id="b1"))
    assert outcome.ok, outcome.error
    assert exchanges.answers and "refused" not in exchanges.answers


def test_ranges_side_by_side_write_what_one_at_a_time_writes(
    warehouse, linked_world, fake_clock, secrets_key
):
    since, until = TODAY - timedelta(days=29), TODAY
    stored = []
    for concurrency in (3, 1):
        exchanges = Exchanges(linked_world)
        syncer = syncer_with(warehouse, linked_world, fake_clock, exchanges,
                             range_rows=12, range_concurrency=concurrency)
        # History sizes the read; its rows are then removed so both reads write all.
        syncer.sync(SyncRequest(ACCOUNT, since, since, run_id=f"seed{concurrency}"))
        with warehouse.connect() as con:
            con.execute("DELETE FROM ad_spend_daily WHERE day > ?", [since])
            con.execute("DELETE FROM site_spend_daily WHERE day > ?", [since])
        outcome = syncer.sync(SyncRequest(ACCOUNT, since, until, run_id=f"r{concurrency}"))
        assert outcome.ok, outcome.error
        assert sorted(outcome.complete_days) == list(days_between(since, until))
        assert len(exchanges.answers) > 15
        with warehouse.connect() as con:
            assert_equals_truth(con, linked_world, ACCOUNT, since, until)
            assert_site_spend_exact(con)
            stored.append(stored_rows(con, ACCOUNT, since, until))
    assert stored[0] == stored[1]


RANGE_ROWS, PAGE_SIZE = 12, 3


@pytest.mark.parametrize("failure", ["throttled", "throttled_17", "http5xx_html"])
def test_a_failed_range_stops_the_others_and_leaves_unread_days_untouched(
    warehouse, linked_world, fake_clock, secrets_key, failure
):
    since, until = TODAY - timedelta(days=29), TODAY - timedelta(days=1)
    exchanges = Exchanges(linked_world)
    syncer = syncer_with(warehouse, linked_world, fake_clock, exchanges, range_rows=RANGE_ROWS,
                         max_retries=0, page_size=PAGE_SIZE)
    assert syncer.sync(SyncRequest(ACCOUNT, since, until, run_id="first")).ok
    with warehouse.connect() as con:
        before = stored_rows(con, ACCOUNT, since, until)
    ads = sorted(linked_world.accounts[ACCOUNT].ads)
    for day in days_between(since, until):
        linked_world.set_ad_day(ACCOUNT, ads[0], day, Figures(Decimal("9.99"), 999, 9, 0))
    linked_world.fail("insights_page", failure, times=None, account=ACCOUNT, skip=12)
    exchanges.answers.clear()

    outcome = syncer.sync(SyncRequest(ACCOUNT, since, until, run_id="second"))

    assert not outcome.ok
    if failure.startswith("throttled"):
        assert outcome.outcome == "throttled"
    failed_at = exchanges.answers.index("failed")
    # No range starts after the failure. A throttle stops the others between pages (each
    # may finish the request it is in); after any other failure they finish their range,
    # so what they read is kept: up to a whole range of pages each, however the threads ran.
    others = RANGE_CONCURRENCY - 1
    pages_per_range = -(-RANGE_ROWS // PAGE_SIZE) + 1
    most = others if failure.startswith("throttled") else others * pages_per_range
    assert len(exchanges.answers) - 1 - failed_at <= most, "ranges went on after the failure"
    read = set(outcome.complete_days)
    assert read and len(read) < 29
    with warehouse.connect() as con:
        for day in days_between(since, until):
            rows = stored_rows(con, ACCOUNT, day, day)
            if day in read:
                assert_equals_truth(con, linked_world, ACCOUNT, day, day)
            else:
                assert rows == {row for row in before if row[1] == day}, day
        assert_site_spend_exact(con)
