"""`ad_catalog` and `ad_thumbnails` on a real Dagster instance, reading the fake Graph over HTTP."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from datetime import datetime, timedelta

import dagster as dg
import pytest

from rastro_assets import cli
from rastro_assets.cli.context import Context
from rastro_assets.defs.catalog import build_catalog_assets
from rastro_assets.defs.keys import AD_CATALOG, AD_THUMBNAILS
from rastro_assets.defs.metadata import catalog_materializations
from rastro_assets.sync.types import SyncRequest
from rastro_assets.timekeeping import fixed_clock
from rastro_assets_tests.conftest import NOW, TOKEN
from rastro_assets_tests.defs.conftest import TODAY

ad_catalog, ad_thumbnails = build_catalog_assets(1)


@pytest.fixture
def account_partitions() -> list[str]:
    return ["act_101", "act_202", "act_9"]  # act_9 is not linked


def materialize(instance, rastro, assets, account: str, **kwargs):
    return dg.materialize(assets, instance=instance, resources={"rastro": rastro},
                          partition_key=account, **kwargs)


def metadata(result, node: str) -> dict:
    """The account's own event (the run's other one is the whole table's)."""
    [event] = [
        event
        for event in result.asset_materializations_for_node(node)
        if event.asset_key.to_user_string() == node and event.partition is not None
    ]
    return {key: value.value for key, value in event.metadata.items()}


def with_picture(world, account: str) -> list[str]:
    return sorted(ad_id for ad_id, ad in world.accounts[account].ads.items()
                  if world.has_thumbnail(ad))


def test_catalog_then_thumbnails_for_one_account(instance, rastro, warehouse, linked_world):
    result = materialize(instance, rastro, [ad_catalog, ad_thumbnails], "act_101")
    assert result.success
    ads = linked_world.accounts["act_101"].ads
    catalog = metadata(result, "ad_catalog")
    assert (catalog["ads_added"], catalog["ads_total"], catalog["ads_renamed"]) == (
        len(ads), len(ads), 0)
    pictures = metadata(result, "ad_thumbnails")
    expected = with_picture(linked_world, "act_101")
    assert (pictures["thumbnails_fetched"], pictures["thumbnails_failed"]) == (len(expected), 0)
    assert pictures["latest_ads"] != "none"
    with warehouse.connect() as con:
        stored = con.execute("SELECT ad_id, image, sha256 FROM ad_thumbnails ORDER BY ad_id")
        stored = stored.fetchall()
        statuses = {row[0] for row in con.execute("SELECT ad_status FROM ad_catalog").fetchall()}
    assert [row[0] for row in stored] == expected
    for ad_id, image, sha256 in stored:
        assert image == linked_world.thumbnail_bytes(ad_id)
        assert sha256 == hashlib.sha256(image).hexdigest()
    assert {ad.effective_status for ad in ads.values()} == statuses
    assert instance.get_materialized_partitions(AD_CATALOG) == {"act_101"}
    assert instance.get_materialized_partitions(AD_THUMBNAILS) == {"act_101"}
    assert_no_picture_in_events(instance, result.run_id, [row[1] for row in stored])

    again = materialize(instance, rastro, [ad_thumbnails], "act_101")
    assert metadata(again, "ad_thumbnails")["thumbnails_fetched"] == 0


def test_a_hand_run_ends_with_the_whole_tables_figures(instance, rastro, warehouse, linked_world):
    """The overview shows the latest materialization's row count: the table's, not the
    account's (act_202's read is 4 of the catalog's 10 ads)."""
    materialize(instance, rastro, [ad_catalog, ad_thumbnails], "act_101")
    materialize(instance, rastro, [ad_catalog, ad_thumbnails], "act_202")
    with warehouse.connect(read_only=True) as con:
        held = {
            table: con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("ad_catalog", "ad_thumbnails")
        }
    for asset_key in (AD_CATALOG, AD_THUMBNAILS):
        [latest] = instance.fetch_materializations(asset_key, limit=1).records
        event = latest.asset_materialization
        assert event.partition is None
        assert event.metadata["dagster/row_count"].value == held[asset_key.path[-1]]
        assert event.metadata["accounts"].value == 2
    assert held["ad_catalog"] == len(linked_world.accounts["act_101"].ads) + len(
        linked_world.accounts["act_202"].ads
    )
    # Partitions are the accounts' own events, untouched by the table's.
    assert instance.get_materialized_partitions(AD_CATALOG) == {"act_101", "act_202"}


def test_failed_pictures_do_not_fail_the_asset(instance, rastro, warehouse, linked_world):
    materialize(instance, rastro, [ad_catalog], "act_202")
    linked_world.fail("thumbnail", "not_found", times=None)
    result = materialize(instance, rastro, [ad_thumbnails], "act_202")
    assert result.success
    values = metadata(result, "ad_thumbnails")
    assert values["thumbnails_failed"] == len(with_picture(linked_world, "act_202"))
    assert values["thumbnails_fetched"] == 0
    assert "sig=" not in values["failures"]


def test_a_dead_token_fails_the_catalog(instance, rastro, warehouse, linked_world):
    linked_world.kill_token(TOKEN)
    result = materialize(instance, rastro, [ad_catalog], "act_202", raise_on_error=False)
    assert not result.success
    description = result.failure_data_for_node("ad_catalog").user_failure_data.description
    assert description.startswith("META_TOKEN_INVALID: ")
    assert instance.get_materialized_partitions(AD_CATALOG) == set()
    thumbs = materialize(instance, rastro, [ad_thumbnails], "act_202", raise_on_error=False)
    assert not thumbs.success  # the connection is now marked invalid: nothing reads Meta


def test_an_unlinked_account_fails_naming_rastro_link(instance, rastro, linked_world):
    for asset, node in ((ad_catalog, "ad_catalog"), (ad_thumbnails, "ad_thumbnails")):
        result = materialize(instance, rastro, [asset], "act_9", raise_on_error=False)
        assert not result.success
        assert result.failure_data_for_node(node).user_failure_data.description == (
            "act_9 is not linked to any site: link it with "
            "`rastro link SITE_ID act_9 --connection CONNECTION_ID` "
            "(the meta_accounts sensor removes partitions of accounts that are not linked)"
        ), node
    assert sum(linked_world.calls.values()) == 0  # refused before any read of Meta


def test_the_definitions_register_both_assets():
    from rastro_assets.definitions import defs

    graph = defs.resolve_asset_graph()
    catalog = graph.get(AD_CATALOG)
    assert dg.AssetKey("ad_spend_daily") in catalog.parent_keys
    assert AD_CATALOG in graph.get(AD_THUMBNAILS).parent_keys
    assert catalog.group_name == "meta_catalog" and catalog.kinds >= {"duckdb"}


def test_a_daily_spend_sync_yields_catalog_events(syncer, linked_world):
    outcome = syncer.sync(SyncRequest("act_202", TODAY, TODAY, kind="daily", catalog=True))
    events = list(catalog_materializations(outcome))
    assert [(event.asset_key, event.partition) for event in events] == [
        (AD_CATALOG, "act_202"), (AD_THUMBNAILS, "act_202")
    ]
    live = syncer.sync(SyncRequest("act_202", TODAY, TODAY, kind="live"))
    assert list(catalog_materializations(live)) == []


def test_a_daily_syncs_catalog_events_carry_no_picture(syncer, linked_world, warehouse):
    outcome = syncer.sync(SyncRequest("act_101", TODAY, TODAY, kind="daily", catalog=True))
    assert outcome.thumbnails is not None and outcome.thumbnails.fetched > 0
    with warehouse.connect() as con:
        images = [row[0] for row in con.execute("SELECT image FROM ad_thumbnails").fetchall()]
    for event in catalog_materializations(outcome):
        text = dg.serialize_value(event)
        assert "base64" not in text
        assert not any(base64.b64encode(image).decode()[:40] in text for image in images)
        assert len(text) < 4096


def assert_no_picture_in_events(instance, run_id: str, images: list[bytes]) -> None:
    """No stored picture, whole or base64, in any event the run logged."""
    assert images
    for record in instance.all_logs(run_id):
        text = dg.serialize_value(record)
        assert "base64" not in text
        assert not any(base64.b64encode(image).decode()[:40] in text for image in images)


def rastro_json(duckdb_path, *args: str) -> list[dict]:
    """`rastro ARGS --json` in-process at NOW: its parsed stdout."""
    out, err = io.StringIO(), io.StringIO()
    ctx = Context(
        environ={"RASTRO_DUCKDB_PATH": str(duckdb_path)},
        stdin=io.StringIO(),
        stdout=out,
        stderr=err,
        clock=fixed_clock(NOW),
    )
    assert cli.run([*args, "--json"], ctx) == 0, err.getvalue()
    return json.loads(out.getvalue())


def test_a_throttled_hand_catalog_read_holds_the_account(
    instance, rastro, duckdb_path, linked_world
):
    """As the cadence's back-off: max(Meta's regain time, 1 h); other accounts untouched."""
    linked_world.fail("ads", "throttled_17", account="act_101", regain_minutes=90)
    result = materialize(instance, rastro, [ad_catalog], "act_101", raise_on_error=False)
    assert not result.success

    status = {entry["ad_account_id"]: entry for entry in rastro_json(duckdb_path, "status")}
    assert status["act_101"]["last_error"].startswith("RATE_LIMITED: ")
    assert status["act_202"]["last_error"] is None
    plans = {entry["ad_account_id"]: entry for entry in rastro_json(duckdb_path, "plan")}
    assert datetime.fromisoformat(plans["act_101"]["due_at"]) >= NOW + timedelta(minutes=90)
    assert datetime.fromisoformat(plans["act_202"]["due_at"]) <= NOW
