"""The sync's spend writer: its thread writes and hands back what it wrote; the outcome
is changed only on the thread that syncs."""

from __future__ import annotations

import threading
from datetime import date, timedelta

import pytest

from rastro_assets.sync import reader, spend_write
from rastro_assets.sync.types import SyncOutcome, SyncRequest
from rastro_assets_tests.truth import assert_equals_truth

TODAY = date(2026, 11, 30)


@pytest.mark.engines("duckdb")
def test_a_streamed_sync_changes_its_outcome_only_on_the_thread_that_syncs(
    syncer, warehouse, linked_world, monkeypatch
):
    monkeypatch.setattr(reader, "BATCH_ROWS", 1)  # every chunk its own batch, on the thread
    linked_world.row_cap = 12  # a month of six ads reads in chunks of two days
    written_on, changed_on = set(), set()
    real_write = spend_write.write_spend_many

    def noting_write(*args, **kwargs):
        written_on.add(threading.current_thread().name)
        return real_write(*args, **kwargs)

    def noting_change(outcome, name, value):
        changed_on.add(threading.current_thread().name)
        object.__setattr__(outcome, name, value)

    monkeypatch.setattr(spend_write, "write_spend_many", noting_write)
    monkeypatch.setattr(SyncOutcome, "__setattr__", noting_change)
    since = TODAY - timedelta(days=29)
    outcome = syncer.sync(SyncRequest("act_101", since, TODAY, run_id="r1"))
    assert outcome.ok, outcome.error
    assert len(outcome.complete_days) == 30 and outcome.rows_written > 0
    assert any(name.startswith("rastro-spend-writer") for name in written_on)
    assert changed_on == {threading.current_thread().name}
    with warehouse.connect() as con:
        assert_equals_truth(con, linked_world, "act_101", since, TODAY)
