"""Insights through the real client against the fake: every day complete, exactly once."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

import httpx
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rastro_assets.meta.errors import ErrorKind, MalformedResponse, MetaError
from rastro_assets.meta.insights import _by_day_and_ad
from rastro_assets.meta.models import (
    INSIGHT_SCHEMA,
    InsightRow,
    InsightsChunk,
    UnrepresentableRow,
    insight_table,
)
from rastro_assets_tests.insight_rows import chunk_from_rows, chunk_rows
from rastro_assets_tests.meta.conftest import BRL, JPY, ClientFactory, truth_rows
from rastro_fake_graph import FakeWorld


def assert_covers(chunks: list[InsightsChunk], since: date, until: date) -> None:
    """Chunks are in date order and cover [since, until] exactly once."""
    expected = since
    for chunk in chunks:
        assert chunk.since == expected
        assert chunk.until >= chunk.since
        for row in chunk_rows(chunk):
            assert chunk.since <= row.day <= chunk.until
        expected = chunk.until + timedelta(days=1)
    assert expected == until + timedelta(days=1)


def all_rows(chunks: list[InsightsChunk]) -> set:
    rows = [row for chunk in chunks for row in chunk_rows(chunk)]
    assert len(rows) == len(set(rows)), "an ad-day came back twice"
    return set(rows)


def test_whole_range_across_many_pages(world: FakeWorld, client_for: ClientFactory) -> None:
    client = client_for(page_size=7)
    since, until = date(2026, 2, 1), date(2026, 3, 15)
    chunks = list(client.insights(BRL, since, until))
    assert len(chunks) == 1 and chunks[0].complete
    assert_covers(chunks, since, until)
    expected = truth_rows(world, BRL, since, until)
    assert all_rows(chunks) == expected
    assert len(expected) > 300
    # Some pages are short on purpose; the client must still read them all.
    assert world.calls["insights"] > len(expected) / 7
    assert client.stats.api_calls == world.calls["insights"]


def test_today_is_read_with_its_partial_figures(world: FakeWorld, client) -> None:
    today = world.today(BRL)
    chunks = list(client.insights(BRL, today, today))
    assert chunk_rows(chunks[0]) and set(chunk_rows(chunks[0])) == set(world.truth(BRL, today))


def test_future_days_are_empty_and_complete(world: FakeWorld, client) -> None:
    tomorrow = world.today(JPY) + timedelta(days=1)
    chunks = list(client.insights(JPY, tomorrow, tomorrow + timedelta(days=5)))
    assert [(chunk_rows(c), c.complete) for c in chunks] == [([], True)]


@pytest.mark.parametrize("row_cap", [1, 9, 25, 60, 5000])
def test_split_down_to_days_and_async(world: FakeWorld, client_for: ClientFactory,
                                      row_cap: int) -> None:
    world.row_cap = row_cap
    client = client_for(page_size=5)
    since, until = date(2026, 2, 20), date(2026, 3, 6)
    chunks = list(client.insights(BRL, since, until))
    assert_covers(chunks, since, until)
    assert all(chunk.complete for chunk in chunks)
    assert all_rows(chunks) == truth_rows(world, BRL, since, until)
    if row_cap == 5000:
        assert len(chunks) == 1
    if row_cap < 12:
        # Some single days hold more than the cap: those ran as async reports.
        assert world.calls["async"] >= 1
        assert world.calls["report"] >= world.calls["async"]


def test_async_report_path(world: FakeWorld, client_for: ClientFactory) -> None:
    world.row_cap = 3
    polls: list[float] = []
    client = client_for(page_size=4, sleep=polls.append, async_poll_seconds=1.5)
    day = date(2026, 3, 1)
    chunks = list(client.insights(BRL, day, day))
    assert len(chunks) == 1 and chunks[0].complete
    assert set(chunk_rows(chunks[0])) == set(world.truth(BRL, day))
    assert world.calls["async"] == 1
    # Job Not Started, Job Running, Job Completed: two waits between three polls.
    assert world.calls["report"] == 3
    assert polls == [1.5, 1.5]
    assert world.calls["report_insights"] >= 2


@pytest.mark.parametrize("outcome", ["job_failed", "job_skipped", "job_stuck"])
def test_failed_async_job_leaves_the_day_incomplete(
    world: FakeWorld, client_for: ClientFactory, outcome: str
) -> None:
    world.row_cap = 3
    world.fail("async", outcome)
    client = client_for(async_poll_seconds=1, async_timeout_seconds=5)
    since, until = date(2026, 3, 1), date(2026, 3, 3)
    chunks = list(client.insights(BRL, since, until))
    assert_covers(chunks, since, until)
    # Days are read side by side, so which day's job met the failure varies.
    [failed] = [chunk for chunk in chunks if not chunk.complete]
    assert failed.since == failed.until and chunk_rows(failed) == []
    rows = all_rows([chunk for chunk in chunks if chunk.complete])
    assert rows == truth_rows(world, BRL, since, until) - truth_rows(
        world, BRL, failed.since, failed.since)


def test_async_creation_refused_as_too_much_leaves_the_day_incomplete(
    world: FakeWorld, client_for: ClientFactory
) -> None:
    world.row_cap = 3
    world.fail("async", "too_much_data")
    day = date(2026, 3, 2)
    chunks = list(client_for().insights(BRL, day, day))
    assert [(c.complete, chunk_rows(c)) for c in chunks] == [(False, [])]


@pytest.mark.parametrize(
    "error", ["too_much_data", "too_much_data_1504018", "too_much_data_1504038", "timeout"]
)
def test_too_much_data_and_timeouts_split(world: FakeWorld, client_for: ClientFactory,
                                          error: str) -> None:
    world.fail("insights", error)
    client = client_for(max_retries=0)
    since, until = date(2026, 3, 1), date(2026, 3, 10)
    chunks = list(client.insights(BRL, since, until))
    # Nothing was known of the account: its first day alone tells the rows per day,
    # which size the rest in ranges of at most half the refused estimate (5 days).
    assert (chunks[0].since, chunks[0].until) == (since, since)
    assert_covers(chunks, since, until)
    assert all(1 <= (c.until - c.since).days + 1 <= 5 for c in chunks)
    assert all(c.complete for c in chunks)
    assert all_rows(chunks) == truth_rows(world, BRL, since, until)


def test_single_day_timeout_runs_async(world: FakeWorld, client_for: ClientFactory) -> None:
    world.fail("insights", "timeout")
    day = date(2026, 3, 4)
    chunks = list(client_for().insights(BRL, day, day))
    assert chunks[0].complete and set(chunk_rows(chunks[0])) == set(world.truth(BRL, day))
    assert world.calls["async"] == 1


def test_timeout_mid_pagination_splits(world: FakeWorld, client_for: ClientFactory) -> None:
    world.fail("insights_page", "timeout")
    since, until = date(2026, 3, 1), date(2026, 3, 4)
    chunks = list(client_for(page_size=5).insights(BRL, since, until))
    assert (chunks[0].since, chunks[0].until) == (since, since)
    assert_covers(chunks, since, until)
    assert len(chunks) >= 2 and all(c.complete for c in chunks)
    assert all_rows(chunks) == truth_rows(world, BRL, since, until)


def test_transient_mid_pagination_is_retried(world: FakeWorld, client_for: ClientFactory) -> None:
    world.fail("insights_page", "http5xx_html", times=2)
    sleeps: list[float] = []
    client = client_for(page_size=5, sleep=sleeps.append)
    since, until = date(2026, 3, 1), date(2026, 3, 3)
    chunks = list(client.insights(BRL, since, until))
    assert len(chunks) == 1 and chunks[0].complete
    assert set(chunk_rows(chunks[0])) == truth_rows(world, BRL, since, until)
    assert len(sleeps) == 2


def test_chunks_stream_and_stay_valid_when_a_later_read_fails(
    world: FakeWorld, client_for: ClientFactory
) -> None:
    world.row_cap = 25
    since, until = date(2026, 3, 1), date(2026, 3, 8)
    # One range at a time, so the later ranges are surely read after the failure is set.
    chunks = client_for(range_concurrency=1).insights(BRL, since, until)
    first = next(chunks)
    assert first.complete and first.since == since
    world.fail("insights", "token_463")
    with pytest.raises(MetaError) as caught:
        list(chunks)
    assert caught.value.kind is ErrorKind.TOKEN
    assert set(chunk_rows(first)) == truth_rows(world, BRL, first.since, first.until)


def test_persistent_transient_error_raises_after_retries(
    world: FakeWorld, client_for: ClientFactory
) -> None:
    world.fail("insights", "transient", times=None)
    client = client_for(max_retries=2)
    with pytest.raises(MetaError) as caught:
        list(client.insights(BRL, date(2026, 3, 1), date(2026, 3, 2)))
    assert caught.value.kind is ErrorKind.TRANSIENT
    assert world.calls["insights"] == 3


def test_jpy_spend_is_exact_whole_yen(world: FakeWorld, client) -> None:
    since, until = date(2026, 2, 1), date(2026, 2, 10)
    chunks = list(client.insights(JPY, since, until))
    rows = [r for c in chunks for r in chunk_rows(c)]
    assert rows
    assert {c.table.schema.field("spend").type for c in chunks} == {pa.decimal128(18, 4)}
    for row in rows:
        assert row.spend == row.spend.to_integral_value()
        assert str(row.spend).endswith(".0000")
    assert set(rows) == truth_rows(world, JPY, since, until)


def test_brl_spend_keeps_cents_exactly(world: FakeWorld, client) -> None:
    ad = sorted(world.accounts[BRL].ads)[0]
    day = date(2026, 2, 2)
    world.set_ad_day(BRL, ad, day, {"spend": "14.35", "impressions": 185, "clicks": 9,
                                    "conversations": 3})
    rows = [r for c in client.insights(BRL, day, day) for r in chunk_rows(c) if r.ad_id == ad]
    assert len(rows) == 1
    row = rows[0]
    assert (row.spend, row.impressions, row.clicks, row.conversations) == (
        Decimal("14.35"), 185, 9, 3)
    assert str(row.spend) == "14.3500"  # decimal128(18, 4): exact, at the warehouse's scale


def test_deleted_and_archived_ads_are_read(world: FakeWorld, client) -> None:
    hidden = {ad.ad_id for ad in world.accounts[BRL].ads.values()
              if ad.effective_status in ("DELETED", "ARCHIVED")}
    assert hidden
    since, until = date(2026, 1, 1), date(2026, 1, 31)
    rows = [r for c in client.insights(BRL, since, until) for r in chunk_rows(c)]
    assert hidden <= {row.ad_id for row in rows}


def test_non_ascii_names_verbatim(world: FakeWorld, client) -> None:
    ad = sorted(world.accounts[JPY].ads)[0]
    world.rename_ad(ad, "夏のセール 🎐 Ação")
    day = date(2026, 3, 1)
    world.set_ad_day(JPY, ad, day, {"spend": "500", "impressions": 10, "clicks": 1})
    rows = [r for c in client.insights(JPY, day, day) for r in chunk_rows(c) if r.ad_id == ad]
    assert rows[0].ad_name == "夏のセール 🎐 Ação"


def test_reread_sees_settling_and_vanishing(world: FakeWorld, client, clock) -> None:
    since, until = date(2026, 2, 20), date(2026, 3, 14)
    before = all_rows(list(client.insights(BRL, since, until)))
    clock.advance(days=40)
    after = all_rows(list(client.insights(BRL, since, until)))
    assert after == truth_rows(world, BRL, since, until)
    keys_before = {(r.ad_id, r.day) for r in before}
    keys_after = {(r.ad_id, r.day) for r in after}
    assert keys_after < keys_before, "some young ad-days vanish once older"
    changed = {(r.ad_id, r.day) for r in before} & keys_after
    moved = [k for k in changed
             if {r.spend for r in before if (r.ad_id, r.day) == k}
             != {r.spend for r in after if (r.ad_id, r.day) == k}]
    assert moved, "figures settle over the following 28 days"


def test_invalid_arguments(client) -> None:
    with pytest.raises(ValueError):
        client.insights("bogus", date(2026, 3, 1), date(2026, 3, 1))
    with pytest.raises(ValueError):
        client.insights(BRL, date(2026, 3, 2), date(2026, 3, 1))
    assert list(client.insights("2001", date(2026, 3, 1), date(2026, 3, 1)))


def _row(ad_id: str, day: str = "2026-03-01") -> dict:
    return {"ad_id": ad_id, "spend": "1.00", "impressions": "1", "clicks": "0",
            "date_start": day, "date_stop": day}


def test_next_url_is_followed_without_access_token_when_no_cursor(
    client_for: ClientFactory,
) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if "page" not in request.url.params:
            return httpx.Response(200, json={"data": [_row("1")], "paging": {
                "next": f"{request.url.copy_merge_params({'page': '2', 'access_token': 'x'})}"}})
        return httpx.Response(200, json={"data": [_row("2")], "paging": {}})

    client = client_for(transport=httpx.MockTransport(answer))
    day = date(2026, 3, 1)
    rows = [r.ad_id for c in client.insights(BRL, day, day) for r in chunk_rows(c)]
    assert rows == ["1", "2"]
    assert "access_token" not in seen[1].url.params
    assert seen[1].headers["authorization"].startswith("Bearer ")


def test_next_url_to_another_host_is_refused(client_for: ClientFactory) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [_row("1")], "paging": {
            "next": "https://elsewhere.test/v25.0/act_2001/insights?page=2"}})

    client = client_for(transport=httpx.MockTransport(answer))
    day = date(2026, 3, 1)
    with pytest.raises(MalformedResponse):
        list(client.insights(BRL, day, day))


def test_repeated_cursor_is_malformed(client_for: ClientFactory) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [_row("1")], "paging": {
            "cursors": {"after": "same"}, "next": str(request.url)}})

    client = client_for(transport=httpx.MockTransport(answer))
    day = date(2026, 3, 1)
    with pytest.raises(MalformedResponse):
        list(client.insights(BRL, day, day))


def test_row_outside_the_asked_range_is_malformed(client_for: ClientFactory) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [_row("1", "2026-02-27")]})

    client = client_for(transport=httpx.MockTransport(answer))
    with pytest.raises(MalformedResponse) as caught:
        list(client.insights(BRL, date(2026, 3, 1), date(2026, 3, 2)))
    assert "outside the asked" in str(caught.value)


def test_a_chunk_is_its_table_and_its_rows_come_from_it() -> None:
    day = date(2026, 3, 1)
    rows = [InsightRow("b", day, Decimal("1.5"), 2, 1, 0, ad_name="Ação"),
            InsightRow("a", day, Decimal(3), 4, 0, 1)]
    chunk = chunk_from_rows(day, day, rows, complete=True)
    assert chunk.table.schema.equals(INSIGHT_SCHEMA)
    assert chunk_rows(chunk) == rows  # as given: chunk_from_rows neither sorts nor drops
    assert str(chunk_rows(chunk)[0].spend) == "1.5000"
    assert chunk == InsightsChunk(day, day, insight_table(rows), True)
    with pytest.raises(UnrepresentableRow, match="ad a on 2026-03-01: spend 1.23456 has more"):
        chunk_from_rows(day, day, [rows[0], InsightRow("a", day, Decimal("1.23456"),
                                                        1, 1, 0)], complete=True)
    with pytest.raises(TypeError, match="insight_table"):
        InsightsChunk(day, day, rows, True)
    with pytest.raises(ValueError, match="INSIGHT_SCHEMA"):
        InsightsChunk(day, day, insight_table(rows).drop_columns(["ad_name"]), True)


def _old_by_day_and_ad(rows: list[InsightRow]) -> list[InsightRow]:
    """What the client did before it read tables."""
    latest = {(row.day, row.ad_id): row for row in rows}
    return [latest[key] for key in sorted(latest)]


@settings(max_examples=150, deadline=None)
@given(st.lists(
    st.lists(
        st.tuples(st.sampled_from(["1", "10", "2", "é", "ad☀", "Z", "z"]),
                  st.integers(0, 2), st.integers(0, 99)),
        max_size=6,
    ),
    max_size=4,
))
def test_pages_out_of_order_or_repeated_end_as_one_row_per_ad_day(pages) -> None:
    day = date(2026, 3, 1)
    page_rows = [[InsightRow(ad, day + timedelta(days=offset), Decimal(cents) / 100, cents, 0, 0)
                  for ad, offset, cents in page] for page in pages]
    got = _by_day_and_ad([insight_table(rows) for rows in page_rows])
    expected = _old_by_day_and_ad([row for rows in page_rows for row in rows])
    assert got.schema.equals(INSIGHT_SCHEMA)
    assert got.to_pylist() == insight_table(expected).to_pylist()
