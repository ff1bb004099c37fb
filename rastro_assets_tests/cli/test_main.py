"""The console script itself: what every command shares at its entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rastro_assets.cli import EXIT_BROKEN_PIPE
from rastro_assets.warehouse import link_store, registry, site_store

SCRIPT = Path(sys.executable).with_name("rastro")


def run_into_closed_pipe(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run `rastro ARGS` with stdout a pipe whose reader is gone before it starts: what
    `rastro ... | head` meets once head has read its lines and left."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return subprocess.run(
            [str(SCRIPT), *args], stdout=writer, stderr=subprocess.PIPE, text=True,
            env=env, timeout=60,
        )
    finally:
        os.close(writer)


@pytest.mark.parametrize(
    "args", [["status", "--json"], ["status"], ["plan", "--json"], ["keygen"]]
)
def test_a_closed_pipe_ends_quietly(args, warehouse, now):
    with warehouse.connect() as con:
        site_store.add_site(con, "s1", None, now)
        registry.save_connection(con, "c1", b"\0" * 40, now)
        link_store.link_account(con, "s1", "act_1", "c1", "UTC", "USD", now)
    env = {**os.environ, "RASTRO_DUCKDB_PATH": str(warehouse.path)}
    env.pop("DAGSTER_HOME", None)
    result = run_into_closed_pipe(args, env)
    assert result.stderr == ""
    assert result.returncode == EXIT_BROKEN_PIPE == 141


BAD_SETTINGS = [
    ("RASTRO_ACCOUNT_SHARDS", "abc"),
    ("RASTRO_ACCOUNT_SHARDS", "0"),
    ("RASTRO_PARTITIONS_START", "yesterday"),
    ("RASTRO_IDLE_LIVE_INTERVAL_MINUTES", "1"),
    ("RASTRO_SENSOR_INTERVAL_SECONDS", "abc"),
    ("RASTRO_SYNC_LEASE_SECONDS", "x"),
    ("RASTRO_RETENTION_INTERVAL_SECONDS", "soon"),
    ("RASTRO_RUN_RETENTION_HOURS", "-1"),
    ("RASTRO_SYNC_RUN_RETENTION_DAYS", "nan"),
]
# Past every range: each overflowed a timedelta or was taken as it came.
HUGE_SETTINGS = [
    (name, "99999999999999999999")
    for name in (
        "RASTRO_RUN_RETENTION_HOURS",
        "RASTRO_SYNC_LEASE_SECONDS",
        "RASTRO_IDLE_LIVE_INTERVAL_MINUTES",
        "RASTRO_SENSOR_INTERVAL_SECONDS",
    )
]


def run_script(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize(
    ("name", "value", "args"),
    [
        *[(*bad, args) for bad in BAD_SETTINGS for args in (["status"], ["keygen"])],
        *[(*huge, ["keygen"]) for huge in HUGE_SETTINGS],
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2_whatever_the_command(
    name, value, args, warehouse
):
    env = {**os.environ, "RASTRO_DUCKDB_PATH": str(warehouse.path), name: value}
    result = run_script(args, env)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("rastro: error: ") and name in line and repr(value) in line, line


def _directory(path: Path) -> Path:
    path.mkdir()
    return path


def _not_duckdb(path: Path) -> Path:
    path.write_text("site_id,name\ns1,one\n")
    return path


def _truncated(path: Path) -> Path:
    from rastro_assets.warehouse.connection import Warehouse

    whole = path.with_name("whole.duckdb")
    Warehouse(whole).migrate()
    path.write_bytes(whole.read_bytes()[:10_000])
    return path


@pytest.mark.parametrize("make", [_directory, _not_duckdb, _truncated])
@pytest.mark.parametrize("args", [["status"], ["site", "add", "s1"]])
def test_a_warehouse_path_that_is_no_duckdb_file_is_one_line_and_exit_2(make, args, tmp_path):
    path = make(tmp_path / "rastro.duckdb")
    before = sorted(p.name for p in tmp_path.iterdir())
    env = {**os.environ, "RASTRO_DUCKDB_PATH": os.path.relpath(path)}
    result = run_script(args, env)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("rastro: error: the warehouse ") and f" {path} " in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_warehouse_url_the_server_refuses_is_one_line_without_its_password(
    rastro, warehouse_server, capsys
):
    """A wrong password in RASTRO_WAREHOUSE_URL is bad input: exit 2, one line, no secret."""
    real = warehouse_server.server.password
    url = warehouse_server.url().replace(real, "not-the-password-x7Q")
    code, out, err = rastro("site", "list", environ={"RASTRO_WAREHOUSE_URL": url})
    assert code == 2
    assert err.count("\n") == 1 and "RASTRO_WAREHOUSE_URL" in err and "rastro:***@" in err
    assert "password authentication failed" in err
    assert "not-the-password-x7Q" not in out + err and real not in out + err
