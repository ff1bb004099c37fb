"""`docs/dagster.scaled.yaml`'s storage keeps each process's Postgres connection open
(`instance/postgres_storage.py`), on a real server: one server backend serves a process's
writes, and a connection the server dropped is replaced without losing a write."""

import contextlib
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml

from rastro_assets_tests.defs.instance_events import add_run
from rastro_assets_tests.postgres_server import PostgresServer, postgres_server

REPO = Path(__file__).resolve().parents[2]
APPLICATION = "rastro-storage-test"
SPEND = dg.AssetKey("ad_spend_daily")


@pytest.fixture
def server_and_instance(
    tmp_path, monkeypatch
) -> Iterator[tuple[PostgresServer, dg.DagsterInstance]]:
    scaled = yaml.safe_load((REPO / "docs" / "dagster.scaled.yaml").read_text())
    storage = scaled["storage"]
    # Names this test's sessions on the server, beside the file's own parameters.
    storage["custom"]["config"]["postgres_db"]["params"]["application_name"] = APPLICATION
    with postgres_server() as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        config = {"storage": storage, "telemetry": {"enabled": False}}
        (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(config))
        with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
            yield server, instance


def sessions_of_the_instance(server: PostgresServer) -> set[int]:
    with contextlib.closing(server.connect()) as con, con.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [APPLICATION]
        )
        return {row[0] for row in cursor.fetchall()}


def record(instance: dg.DagsterInstance, days: list[str]) -> None:
    for day in days:
        instance.report_runless_asset_event(dg.AssetMaterialization(SPEND, partition=day))


def recorded_days(instance: dg.DagsterInstance) -> set[str]:
    records = instance.fetch_materializations(SPEND, limit=100).records
    return {record.partition_key for record in records}


def test_a_process_writes_through_one_kept_connection(server_and_instance):
    server, instance = server_and_instance
    record(instance, ["act_1|2026-11-01"])
    kept = sessions_of_the_instance(server)
    assert len(kept) == 1

    record(instance, [f"act_1|2026-11-{day:02d}" for day in range(2, 22)])
    add_run(instance, "wave_1")
    instance.add_run_tags("wave_1", {"checked": "yes"})

    assert sessions_of_the_instance(server) == kept
    assert len(recorded_days(instance)) == 21
    assert instance.get_run_by_id("wave_1").tags["checked"] == "yes"


def test_a_connection_the_server_dropped_is_replaced_and_no_write_is_lost(server_and_instance):
    server, instance = server_and_instance
    record(instance, ["act_1|2026-11-01"])
    (dropped,) = sessions_of_the_instance(server)
    with contextlib.closing(server.connect()) as con, con.cursor() as cursor:
        con.autocommit = True
        # The timeout makes the call wait until the backend has exited, not only signal it.
        cursor.execute("SELECT pg_terminate_backend(%s, 10000)", [dropped])
        assert cursor.fetchone() == (True,)

    record(instance, ["act_1|2026-11-02"])

    (replacement,) = sessions_of_the_instance(server)
    assert replacement != dropped
    assert recorded_days(instance) == {"act_1|2026-11-01", "act_1|2026-11-02"}
