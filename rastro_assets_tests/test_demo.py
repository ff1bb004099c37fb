"""`rastro demo`'s preparation: idempotent, and a correct hand-over to `dagster dev`."""

from __future__ import annotations

import os
import shutil
import stat
from datetime import timedelta
from pathlib import Path

import pytest

from rastro_assets import demo
from rastro_assets.meta.fake import DEMO_TOKEN, FakeWorld
from rastro_assets.outcomes import ConnectionStatus
from rastro_assets.vault import ENV_VAR, Vault, generate_key
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.connection import Warehouse

REPO = Path(__file__).resolve().parents[1]
TABLES = ("sites", "meta_connections", "meta_ad_accounts", "site_ad_accounts")


@pytest.fixture
def paths(tmp_path: Path) -> demo.DemoPaths:
    """An empty repo root: its dagster.yaml and workspace.yaml, no data/ yet."""
    shutil.copy(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    shutil.copy(REPO / "workspace.yaml", tmp_path / "workspace.yaml")
    return demo.DemoPaths(tmp_path)


def snapshot(paths: demo.DemoPaths) -> dict[str, list[tuple]]:
    with Warehouse(paths.duckdb).connect(read_only=True) as con:
        return {
            table: con.execute(f"SELECT * FROM {table} ORDER BY ALL").fetchall() for table in TABLES
        }


def test_what_prepare_creates_is_private_under_any_umask(paths: demo.DemoPaths, now):
    previous = os.umask(0)
    try:
        demo.prepare(paths, now=now, environ={})
    finally:
        os.umask(previous)
    modes = {
        path: stat.S_IMODE(path.stat().st_mode)
        for path in (paths.data, paths.dagster_home, paths.key_file, paths.duckdb)
    }
    assert modes == {
        paths.data: 0o700,
        paths.dagster_home: 0o700,
        paths.key_file: 0o600,
        paths.duckdb: 0o600,
    }


def test_prepare_twice_reuses_everything(paths: demo.DemoPaths, now):
    first = demo.prepare(paths, now=now, environ={})
    key = paths.key_file.read_text().strip()
    assert stat.S_IMODE(paths.key_file.stat().st_mode) == 0o600
    rows = snapshot(paths)

    second = demo.prepare(paths, now=now + timedelta(days=1), environ={})
    assert second == first
    assert paths.key_file.read_text().strip() == key
    assert snapshot(paths) == rows  # same sealed token, same link times: nothing rewritten

    assert first == {
        ENV_VAR: key,
        "RASTRO_META_FAKE": "true",
        "RASTRO_DUCKDB_PATH": str(paths.data / "rastro.duckdb"),
        "DAGSTER_HOME": str(paths.data / "dagster_home"),
        "RASTRO_ANALYTICS_LAG_SECONDS": "60",
    }
    assert (paths.dagster_home / "dagster.yaml").read_text() == (
        paths.root / "dagster.yaml"
    ).read_text()


def test_prepare_links_the_fake_worlds_accounts(paths: demo.DemoPaths, now):
    env = demo.prepare(paths, now=now, environ={})
    world = FakeWorld.demo()
    with Warehouse(paths.duckdb).connect(read_only=True) as con:
        sites = con.execute("SELECT site_id FROM sites ORDER BY ALL").fetchall()
        links = con.execute("SELECT site_id, ad_account_id FROM site_ad_accounts").fetchall()
        accounts = registry.linked_accounts(con)
        connection = registry.get_connection(con, demo.DEMO_CONNECTION)
    assert [site for (site,) in sites] == sorted(demo.DEMO_SITES)
    assert sorted(links) == sorted(
        (site, account) for site, ids in demo.DEMO_LINKS.items() for account in ids
    )
    assert [account.ad_account_id for account in accounts] == ["act_1001", "act_1002", "act_1003"]
    for account in accounts:
        fake = world.accounts[account.ad_account_id]
        assert (account.timezone, account.currency, account.name) == (
            fake.timezone,
            fake.currency,
            fake.name,
        )
        assert account.connection_id == demo.DEMO_CONNECTION
        assert account.created_at == now
    assert len({account.timezone for account in accounts}) == 3
    assert len({account.currency for account in accounts}) == 3
    assert connection.status == ConnectionStatus.ACTIVE
    vault = Vault.from_env({ENV_VAR: env[ENV_VAR]})
    assert vault.open(demo.DEMO_CONNECTION, connection.sealed_token) == DEMO_TOKEN
    assert DEMO_TOKEN.encode() not in paths.duckdb.read_bytes()


def test_a_key_in_the_environment_wins_and_the_demo_token_follows(paths: demo.DemoPaths, now):
    demo.prepare(paths, now=now, environ={})
    links = snapshot(paths)["site_ad_accounts"]
    own_key = generate_key()
    env = demo.prepare(paths, now=now, environ={ENV_VAR: own_key})
    assert env[ENV_VAR] == own_key
    with Warehouse(paths.duckdb).connect(read_only=True) as con:
        connection = registry.get_connection(con, demo.DEMO_CONNECTION)
    sealed = connection.sealed_token
    assert Vault.from_env({ENV_VAR: own_key}).open(demo.DEMO_CONNECTION, sealed) == DEMO_TOKEN
    assert snapshot(paths)["site_ad_accounts"] == links


def test_a_paused_demo_connection_is_revived(paths: demo.DemoPaths, now):
    demo.prepare(paths, now=now, environ={})
    with Warehouse(paths.duckdb).connect() as con:
        sealed_at = registry.get_connection(con, demo.DEMO_CONNECTION).sealed_at
        registry.mark_connection_invalid(
            con, demo.DEMO_CONNECTION, "dead", now, token_sealed_at=sealed_at
        )
    demo.prepare(paths, now=now + timedelta(minutes=1), environ={})
    with Warehouse(paths.duckdb).connect(read_only=True) as con:
        assert registry.get_connection(con, demo.DEMO_CONNECTION).status == ConnectionStatus.ACTIVE


def test_run_prepares_then_execs_dagster_dev(paths: demo.DemoPaths, monkeypatch, capsys):
    handed = []

    def execvpe(file, argv, env):
        handed.append((file, argv, env))

    monkeypatch.setattr(demo.os, "execvpe", execvpe)
    monkeypatch.setattr(demo.signal, "signal", lambda *args: None)
    monkeypatch.chdir(REPO)
    assert demo.run(paths.root, ["--port", "3001"], environ={"KEEP": "me"}) == 0
    [(file, argv, env)] = handed
    assert Path(file).name == "dagster"
    assert argv[1:] == ["dev", "-w", "workspace.yaml", "--port", "3001"]
    assert env["KEEP"] == "me"
    assert env["DAGSTER_HOME"] == str(paths.root.resolve() / "data" / "dagster_home")
    assert env[ENV_VAR] == paths.key_file.read_text().strip()
    assert Path.cwd() == paths.root.resolve()
    assert "http://127.0.0.1:3001" in capsys.readouterr().out


def test_run_outside_the_repo_root(tmp_path: Path, capsys):
    assert demo.run(tmp_path, [], environ={}) == 2
    assert "repo root" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()
