"""`rastro` inside the demo's checkout: `connect` seals with the key the demo's daemon has,
and `publish` publishes the analytics snapshot without Dagster's warnings."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

import pytest

from rastro_assets import demo
from rastro_assets.cli import tools
from rastro_assets.cli.context import Context
from rastro_assets.demo.paths import DemoPaths
from rastro_assets.vault import ENV_VAR, Vault, generate_key
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.cli.conftest import Rastro, assert_usage_error

REPO = Path(__file__).resolve().parents[2]
TOKEN = "EAAB0demoCheckoutToken0123456789abcdef"
DEMO_LINE = (
    f"{ENV_VAR} is not set: sealing with the demo's key in data/secrets.key, the one"
    f" `rastro demo` gives its daemon when {ENV_VAR} is unset"
)


@pytest.fixture
def rastro_environ() -> Mapping[str, str]:
    """No variable names a file or a key: the files are found from the working directory."""
    return {}


@pytest.fixture
def never_printed() -> list[str]:
    return [TOKEN]


@pytest.fixture
def checkout(tmp_path: Path, now: datetime, monkeypatch: pytest.MonkeyPatch) -> DemoPaths:
    """A checkout where `rastro demo` has prepared data/, as the working directory."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("dagster.yaml", "workspace.yaml"):
        shutil.copy(REPO / name, root / name)
    paths = DemoPaths(root)
    demo.prepare(paths, now=now, environ={})
    monkeypatch.chdir(root)
    return paths


@pytest.fixture
def daemon_env(checkout: DemoPaths, now: datetime) -> dict[str, str]:
    """The environment `rastro demo` starts Dagster with, when RASTRO_SECRETS_KEY is unset."""
    return demo.prepare(checkout, now=now, environ={})


def sealed(paths: DemoPaths, connection_id: str) -> bytes | None:
    with Warehouse(paths.duckdb).connect(read_only=True) as con:
        connection = registry.get_connection(con, connection_id)
    return connection.sealed_token if connection else None


def test_connect_in_the_demos_checkout_seals_with_the_key_its_daemon_has(
    rastro: Rastro, checkout: DemoPaths, daemon_env: dict[str, str]
):
    code, out, err = rastro("connect", "mine", "--no-verify", stdin=TOKEN)
    assert (code, err) == (0, "")
    assert out.splitlines() == [DEMO_LINE, "connection mine saved"]
    assert daemon_env[ENV_VAR] not in out
    # The daemon opens it with what the demo handed it.
    assert Vault.from_env(daemon_env).open("mine", sealed(checkout, "mine")) == TOKEN


def test_a_key_in_the_environment_wins_over_the_demos_file(
    rastro: Rastro, checkout: DemoPaths
):
    own = generate_key()
    code, out, _ = rastro("connect", "mine", "--no-verify", stdin=TOKEN, environ={ENV_VAR: own})
    assert (code, out) == (0, "connection mine saved\n")
    assert Vault.from_env({ENV_VAR: own}).open("mine", sealed(checkout, "mine")) == TOKEN


@pytest.mark.parametrize("mode", [0o640, 0o644])
def test_a_demo_key_file_others_may_read_is_refused_and_nothing_is_sealed(
    rastro: Rastro, checkout: DemoPaths, mode: int
):
    checkout.key_file.chmod(mode)
    assert_usage_error(
        rastro("connect", "mine", "--no-verify", stdin=TOKEN),
        f"{checkout.key_file} is open to group or others (mode {mode:04o})",
        "chmod 600",
    )
    assert sealed(checkout, "mine") is None


def test_a_symlink_at_the_demos_key_file_is_refused(
    rastro: Rastro, checkout: DemoPaths, tmp_path: Path
):
    theirs = tmp_path / "theirs.key"
    theirs.write_text(generate_key())
    theirs.chmod(0o600)
    checkout.key_file.unlink()
    checkout.key_file.symlink_to(theirs)
    assert_usage_error(
        rastro("connect", "mine", "--no-verify", stdin=TOKEN),
        f"{checkout.key_file} is a symbolic link",
    )
    assert sealed(checkout, "mine") is None


def test_another_warehouse_from_the_checkout_names_the_demo_key_not_taken(
    rastro: Rastro, checkout: DemoPaths, tmp_path: Path
):
    other = tmp_path / "other.duckdb"
    line = assert_usage_error(
        rastro(
            "connect",
            "mine",
            "--no-verify",
            stdin=TOKEN,
            environ={"RASTRO_DUCKDB_PATH": str(other)},
        ),
        f"{ENV_VAR} is not set, and data/secrets.key is the demo's key",
        f"this command's warehouse is {other}",
        f"export {ENV_VAR}",
    )
    assert "rastro keygen" not in line


def test_the_demos_warehouse_from_outside_its_checkout_names_the_key_beside_it(
    rastro: Rastro, checkout: DemoPaths, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert_usage_error(
        rastro(
            "connect",
            "mine",
            "--no-verify",
            stdin=TOKEN,
            environ={"RASTRO_DUCKDB_PATH": str(checkout.duckdb)},
        ),
        f"{ENV_VAR} is not set, and {checkout.key_file} is the demo's key",
    )
    assert sealed(checkout, "mine") is None


def test_without_a_demo_key_file_the_variable_is_asked_for(rastro: Rastro, tmp_path: Path):
    assert_usage_error(
        rastro(
            "connect",
            "mine",
            "--no-verify",
            stdin=TOKEN,
            environ={"RASTRO_DUCKDB_PATH": str(tmp_path / "plain.duckdb")},
        ),
        f"{ENV_VAR} is not set: tokens cannot be sealed or opened without it",
        "rastro keygen",
    )


def test_sealing_vault_says_nothing_when_the_variable_is_set(checkout: DemoPaths):
    key = generate_key()
    out = io.StringIO()
    ctx = Context(environ={ENV_VAR: key}, stdin=io.StringIO(), stdout=out, stderr=io.StringIO())
    sealed_token = tools.sealing_vault(ctx).seal("c", TOKEN)
    assert Vault.from_env({ENV_VAR: key}).open("c", sealed_token) == TOKEN
    assert out.getvalue() == ""


# publish --------------------------------------------------------------------------


def test_publish_writes_the_snapshot_now(rastro: Rastro, checkout: DemoPaths):
    snapshot = checkout.data / "analytics.duckdb"
    assert not snapshot.exists()
    code, out, err = rastro("publish")
    assert (code, err) == (0, "")
    assert out.startswith(f"published {snapshot}: ")
    code, out, _ = rastro("sql", "SELECT count(*) AS n FROM sites", "--format", "csv")
    assert (code, out.split()) == (0, ["n", "2"])


def test_publish_without_a_warehouse_writes_nothing(rastro: Rastro, tmp_path: Path):
    missing = tmp_path / "none" / "rastro.duckdb"
    assert_usage_error(
        rastro("publish", environ={"RASTRO_DUCKDB_PATH": str(missing)}), "no warehouse at"
    )
    assert not missing.parent.exists()


def test_publish_prints_no_warning_of_dagsters(checkout: DemoPaths):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RASTRO_", "DAGSTER_"))}
    rastro = Path(sys.executable).parent / "rastro"
    result = subprocess.run(
        [str(rastro), "publish"], cwd=checkout.root, env=env, capture_output=True, text=True
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("published ")
