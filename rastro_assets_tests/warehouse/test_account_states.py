"""What the planner reads of each linked account besides its runs, against a real warehouse
file: its link and connection, and its recent delivery."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from rastro_assets.meta.models import Ad, InsightRow, insight_table
from rastro_assets.warehouse import link_store, registry, shard_store, site_store
from rastro_assets.warehouse.account_states import LinkedState, linked_states, recent_deliveries
from rastro_assets.warehouse.ad_spend_table import write_spend
from rastro_assets.warehouse.catalog import upsert_catalog
from rastro_assets_tests.conftest import NOW, record_sync_run

TODAY = NOW.date()
DAY = timedelta(days=1)


def test_linked_states_carry_sites_shard_and_the_connection_s_state(con, linked_account):
    site_store.add_site(con, "s2", "Site two", NOW)
    link_store.link_account(con, "s2", "act_1", "c1", "America/Sao_Paulo", "BRL", NOW)
    link_store.link_account(con, "s2", "act_2", "c1", "Asia/Tokyo", "JPY", NOW)
    shard_store.set_account_shard(con, "act_2", 3)
    registry.request_sync(con, "act_2", NOW + DAY)
    registry.mark_connection_invalid(con, "c1", "Meta said no", NOW + DAY, token_sealed_at=NOW)

    states = linked_states(con)

    assert states == [
        LinkedState("act_1", "America/Sao_Paulo", NOW, None, "c1", "invalid", "Meta said no",
                    NOW, ("s1", "s2"), 0),
        LinkedState("act_2", "Asia/Tokyo", NOW, NOW + DAY, "c1", "invalid", "Meta said no",
                    NOW, ("s2",), 3),
    ]
    assert [state.ad_account_id for state in linked_states(con, ["act_2", "act_9"])] == ["act_2"]
    assert linked_states(con, []) == []


def spend(con, account: str, day, amount: str) -> None:
    rows = insight_table([InsightRow(f"{account}-a1", day, Decimal(amount), 100, 2, 0)])
    write_spend(con, account, days=[day], rows=rows, complete_days=[day], synced_at=NOW)


def test_recent_deliveries_name_the_last_day_with_spend_and_any_active_ad(con, linked_account):
    for account in ("act_2", "act_3", "act_4"):
        link_store.link_account(con, "s1", account, "c1", "UTC", "USD", NOW)
    record_sync_run(con, "newest", "act_1", "live", TODAY - DAY, TODAY, NOW)
    spend(con, "act_1", TODAY - DAY, "1.5000")
    spend(con, "act_1", TODAY - 10 * DAY, "9.0000")
    spend(con, "act_2", TODAY - 10 * DAY, "9.0000")  # before the newest start's days
    spend(con, "act_3", TODAY, "0.0000")
    upsert_catalog(con, "act_4", [Ad("act_4-a1", effective_status="ACTIVE")], NOW, refile=True)

    assert recent_deliveries(con) == {
        "act_1": (TODAY - DAY, False),
        "act_4": (None, True),
    }
    assert recent_deliveries(con, ["act_4", "act_3"]) == {"act_4": (None, True)}
    assert recent_deliveries(con, []) == {}
