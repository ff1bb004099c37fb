"""The spend reader: Meta's answer as write batches, and what comes first when a read fails."""

from __future__ import annotations

from datetime import date, timedelta

import pytest

from rastro_assets.meta.errors import MetaError
from rastro_assets.sync import reader
from rastro_assets.sync.reader import read_spend
from rastro_assets.timekeeping import days_between
from rastro_assets_tests.conftest import TOKEN

# The reader never touches the warehouse: one engine is enough.
pytestmark = pytest.mark.engines("duckdb")

TODAY = date(2026, 11, 30)
SINCE = TODAY - timedelta(days=29)


def truth_count(world, since: date, until: date) -> int:
    return sum(len(world.truth("act_101", day)) for day in days_between(since, until))


def test_a_read_that_fits_one_batch_is_one_whole_batch(syncer, linked_world):
    client = syncer.client_factory(TOKEN)
    [batch] = read_spend(client, "act_101", SINCE, TODAY)
    assert batch.whole
    assert sorted(batch.complete_days) == list(days_between(SINCE, TODAY))
    assert batch.incomplete_days == []
    assert batch.rows.num_rows == truth_count(linked_world, SINCE, TODAY)


def test_batches_of_a_larger_read_cover_the_range_once(
    syncer, linked_world, monkeypatch
):
    monkeypatch.setattr(reader, "BATCH_ROWS", 1)
    linked_world.row_cap = 12  # a month of six ads reads in chunks of two days
    batches = list(read_spend(syncer.client_factory(TOKEN), "act_101", SINCE, TODAY))
    assert len(batches) > 1
    assert not any(batch.whole for batch in batches)
    days = [day for batch in batches for day in batch.days]
    assert sorted(days) == list(days_between(SINCE, TODAY))
    assert sum(batch.rows.num_rows for batch in batches) == truth_count(
        linked_world, SINCE, TODAY
    )


def test_a_failed_read_yields_what_it_read_whole_then_raises(syncer, linked_world):
    linked_world.row_cap = 12
    linked_world.fail("insights", "http5xx_html", times=None, account="act_101", skip=12)
    batches = read_spend(syncer.client_factory(TOKEN), "act_101", SINCE, TODAY)
    first = next(batches)
    assert not first.whole
    assert first.days and set(first.complete_days) == set(first.days)
    # Ranges are read side by side: the days read whole need not be one run of days.
    assert first.rows.num_rows == sum(truth_count(linked_world, day, day) for day in first.days)
    with pytest.raises(MetaError):
        next(batches)
