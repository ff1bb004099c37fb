"""Short-lived connections: closed after use, patient with another process's lock."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from rastro_assets.warehouse import dialect
from rastro_assets.warehouse.connection import (
    FIRST_RETRY_SECONDS,
    MAX_RETRY_SECONDS,
    Warehouse,
    WarehouseError,
    WarehouseLocked,
    in_transaction,
    transaction,
)

DUCKDB_FILE_LOCK = pytest.mark.engines("duckdb")
"""One process holding the file read-write locks out every other: a PostgreSQL server has
no such lock to wait for."""

HOLDER = """
import sys, time, duckdb
con = duckdb.connect(sys.argv[1])
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
con.close()
"""


def hold_lock(path: Path, seconds: float) -> subprocess.Popen:
    """Another process that opens `path` read-write, holds it `seconds`, then closes."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "locked"
    return process


@pytest.fixture
def holder(warehouse: Warehouse, duckdb_path: Path) -> Iterator[subprocess.Popen]:
    process = hold_lock(duckdb_path, 30)
    yield process
    process.kill()
    process.wait()


def test_connection_is_closed_when_the_block_ends(warehouse: Warehouse):
    with warehouse.connect() as con:
        assert con.execute("SELECT 42").fetchone() == (42,)
    with pytest.raises(WarehouseError):
        con.execute("SELECT 1")


def test_connection_is_closed_when_the_block_raises(warehouse: Warehouse):
    with pytest.raises(RuntimeError), warehouse.connect() as con:
        raise RuntimeError("boom")
    with pytest.raises(WarehouseError):
        con.execute("SELECT 1")


def test_parent_directory_is_created(tmp_path: Path):
    path = tmp_path / "a" / "b" / "w.duckdb"
    with Warehouse(path).connect() as con:
        con.execute("SELECT 1")
    assert path.exists()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_file_its_wal_and_directory_are_private_under_umask_000(tmp_path: Path):
    """DuckDB makes the `.wal` at the first write of a held file, and anew after each close."""
    path = tmp_path / "data" / "pipeline" / "rastro.duckdb"
    wal = Path(f"{path}.wal")
    previous = os.umask(0)
    try:
        seen = []
        for value in (1, 2):
            with Warehouse(path).held() as held:
                with held.connect() as con:
                    con.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
                    con.execute("INSERT INTO t VALUES (?)", [value])
                seen.append(mode(wal))
            assert not wal.exists()
        assert seen == [0o600, 0o600]
        assert [mode(path.parent.parent), mode(path.parent), mode(path)] == [0o700, 0o700, 0o600]
        assert os.umask(0) == 0, "the umask is given back after the last connection"
    finally:
        os.umask(previous)


def test_sessions_run_in_utc(warehouse: Warehouse):
    with warehouse.connect() as con:
        assert con.execute("SELECT current_setting('TimeZone')").fetchone() == ("UTC",)


def test_read_only_beside_a_writer_of_the_same_process_shares_it(warehouse: Warehouse):
    with warehouse.connect() as writer, warehouse.connect(read_only=True) as reader:
        writer.execute("INSERT INTO sites VALUES ('s1', 'one', now())")
        assert reader.execute("SELECT site_id FROM sites").fetchall() == [("s1",)]


@DUCKDB_FILE_LOCK
def test_waits_for_another_process_then_connects(warehouse: Warehouse, duckdb_path: Path):
    process = hold_lock(duckdb_path, 1.5)
    try:
        started = time.monotonic()
        with warehouse.connect() as con:
            waited = time.monotonic() - started
            con.execute("INSERT INTO sites VALUES ('s1', 'after the wait', now())")
        assert waited >= 0.5
        assert process.wait(timeout=10) == 0
    finally:
        process.kill()
        process.wait()


@DUCKDB_FILE_LOCK
def test_readers_wait_too(warehouse: Warehouse, duckdb_path: Path):
    process = hold_lock(duckdb_path, 1.0)
    try:
        with Warehouse(duckdb_path).connect(read_only=True) as con:
            assert con.execute("SELECT count(*) FROM sites").fetchone() == (0,)
    finally:
        process.kill()
        process.wait()


@DUCKDB_FILE_LOCK
def test_gives_up_naming_the_holder(duckdb_path: Path, holder: subprocess.Popen):
    warehouse = Warehouse(duckdb_path, lock_wait_seconds=0.3)
    started = time.monotonic()
    with pytest.raises(WarehouseLocked) as locked, warehouse.connect():
        pytest.fail("connected to a locked file")
    assert time.monotonic() - started < 5
    message = str(locked.value)
    assert f"PID {holder.pid}" in message
    assert "locked by another process" in message
    assert str(duckdb_path) in message
    assert "query the analytics snapshot" in message
    assert locked.value.pid == holder.pid
    assert "python" in (locked.value.holder or "")


@DUCKDB_FILE_LOCK
def test_the_lock_error_names_the_snapshot_the_settings_name(
    duckdb_path: Path, holder: subprocess.Popen, tmp_path: Path, monkeypatch
):
    """The snapshot comes from the settings it was given, never from the environment again."""
    monkeypatch.setenv("RASTRO_ANALYTICS_PATH", str(tmp_path / "from-the-environment.duckdb"))
    elsewhere = tmp_path / "shared" / "analytics.duckdb"
    cases = {
        Warehouse(duckdb_path, lock_wait_seconds=0, snapshot_path=elsewhere): elsewhere,
        Warehouse(duckdb_path, lock_wait_seconds=0): duckdb_path.with_name("analytics.duckdb"),
    }
    for warehouse, snapshot in cases.items():
        with pytest.raises(WarehouseLocked) as locked, warehouse.connect():
            pass
        assert f"query the analytics snapshot instead ({snapshot}," in str(locked.value)


@DUCKDB_FILE_LOCK
def test_back_off_doubles_with_jitter_up_to_the_cap(duckdb_path: Path, holder: subprocess.Popen):
    pauses: list[float] = []
    warehouse = Warehouse(duckdb_path, lock_wait_seconds=12.0, sleep=pauses.append)
    with pytest.raises(WarehouseLocked) as locked, warehouse.connect():
        pass
    assert sum(pauses) == pytest.approx(12.0)
    assert locked.value.waited_seconds == pytest.approx(12.0)
    assert FIRST_RETRY_SECONDS * 0.75 <= pauses[0] <= FIRST_RETRY_SECONDS * 1.25
    assert all(pause <= MAX_RETRY_SECONDS for pause in pauses)
    assert pauses[4] > pauses[0] * 8
    assert max(pauses) > MAX_RETRY_SECONDS * 0.7
    assert len(pauses) < 20


@DUCKDB_FILE_LOCK
def test_zero_wait_fails_at_once(duckdb_path: Path, holder: subprocess.Popen):
    pauses: list[float] = []
    warehouse = Warehouse(duckdb_path, lock_wait_seconds=0, sleep=pauses.append)
    with pytest.raises(WarehouseLocked), warehouse.connect(read_only=True):
        pass
    assert pauses == []


def test_other_io_errors_are_not_taken_for_a_lock(tmp_path: Path):
    directory = tmp_path / "a-directory.duckdb"
    directory.mkdir()
    with pytest.raises(duckdb.IOException), Warehouse(directory, sleep=pytest.fail).connect():
        pass


def test_transaction_commits(con: duckdb.DuckDBPyConnection):
    with transaction(con):
        assert in_transaction(con)
        con.execute("INSERT INTO sites VALUES ('s1', 'one', now())")
    assert not in_transaction(con)
    assert con.execute("SELECT count(*) FROM sites").fetchone() == (1,)


def test_transaction_rolls_back_on_error(con: duckdb.DuckDBPyConnection):
    with pytest.raises(RuntimeError), transaction(con):
        con.execute("INSERT INTO sites VALUES ('s1', 'one', now())")
        raise RuntimeError("boom")
    assert not in_transaction(con)
    assert con.execute("SELECT count(*) FROM sites").fetchone() == (0,)


def test_nested_transaction_joins_the_outer_one(con: duckdb.DuckDBPyConnection):
    with pytest.raises(RuntimeError), transaction(con):
        with transaction(con):
            con.execute("INSERT INTO sites VALUES ('s1', 'one', now())")
        assert in_transaction(con)
        raise RuntimeError("the outer unit fails")
    assert con.execute("SELECT count(*) FROM sites").fetchone() == (0,)


def test_transaction_joins_one_opened_by_hand(con: duckdb.DuckDBPyConnection):
    con.execute("BEGIN TRANSACTION")
    with transaction(con):
        con.execute("INSERT INTO sites VALUES ('s1', 'one', now())")
    assert in_transaction(con)
    con.execute("ROLLBACK")
    assert con.execute("SELECT count(*) FROM sites").fetchone() == (0,)


def test_transaction_after_a_failed_statement_rolls_back(con: duckdb.DuckDBPyConnection):
    con.execute("INSERT INTO sites VALUES ('s1', 'one', now())")
    with pytest.raises(dialect.ConstraintViolated), transaction(con):
        con.execute("INSERT INTO sites VALUES ('s2', 'two', now())")
        con.execute("INSERT INTO sites VALUES ('s1', 'again', now())")
    assert con.execute("SELECT site_id FROM sites").fetchall() == [("s1",)]
    with transaction(con):
        con.execute("INSERT INTO sites VALUES ('s3', 'three', now())")
    assert con.execute("SELECT count(*) FROM sites").fetchone() == (2,)


def test_a_path_duckdb_cannot_open_is_bad_input_naming_the_absolute_path(tmp_path, monkeypatch):
    from rastro_assets.warehouse.connection import WarehouseUnreadable

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-directory").mkdir()
    (tmp_path / "text.duckdb").write_text("not a database\n")
    Warehouse(tmp_path / "whole.duckdb").migrate()
    (tmp_path / "cut.duckdb").write_bytes((tmp_path / "whole.duckdb").read_bytes()[:10_000])
    (tmp_path / "a-file").write_text("")
    for name in ("a-directory", "text.duckdb", "cut.duckdb", "a-file/below.duckdb"):
        for read_only in (False, True):
            with pytest.raises(WarehouseUnreadable) as refused, Warehouse(name).connect(
                read_only=read_only
            ):
                pass
            assert f"the warehouse {tmp_path / name} (RASTRO_DUCKDB_PATH)" in str(refused.value)
            assert isinstance(refused.value, duckdb.Error)


def _opens_in(path: str, storage: str) -> bool:
    """Whether the file's storage is `storage` or older: DuckDB refuses to attach a file
    with a storage version lower than the file's own."""
    with duckdb.connect() as probe:
        try:
            probe.execute(f"ATTACH ? AS p (READ_ONLY, STORAGE_VERSION '{storage}')", [path])
        except duckdb.InvalidInputException as exc:
            assert "cannot be lowered" in str(exc)
            return False
    return True


def test_a_new_file_is_written_in_the_storage_of_the_operators_shell(tmp_path):
    from rastro_assets.warehouse.connection import PIPELINE_STORAGE_VERSION

    warehouse = Warehouse(tmp_path / "rastro.duckdb")
    with warehouse.connect() as con:
        con.execute("INSERT INTO sites VALUES ('s1', 'one', now())")
    assert _opens_in(warehouse.path, PIPELINE_STORAGE_VERSION)


def test_a_file_already_in_a_newer_storage_keeps_it_and_opens(tmp_path):
    from rastro_assets.warehouse.connection import PIPELINE_STORAGE_VERSION

    path = str(tmp_path / "rastro.duckdb")
    duckdb.connect(path, config={"storage_compatibility_version": "latest"}).close()
    assert not _opens_in(path, PIPELINE_STORAGE_VERSION)
    warehouse = Warehouse(path)
    with warehouse.connect() as con:
        con.execute("INSERT INTO sites VALUES ('s1', 'one', now())")
    with warehouse.connect(read_only=True) as con:
        assert con.execute("SELECT count(*) FROM sites").fetchone() == (1,)
    assert not _opens_in(path, PIPELINE_STORAGE_VERSION)
