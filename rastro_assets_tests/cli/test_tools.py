"""`rastro rotate-key`, `rastro fake-meta` and `rastro demo` (without starting anything)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from rastro_assets import demo
from rastro_assets.cli import tools
from rastro_assets.vault import ENV_VAR, SecretsKeyError, Vault, generate_key
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.connection import Warehouse
from rastro_assets_tests.cli.conftest import assert_usage_error
from rastro_fake_graph import server

REPO_WORKSPACE = Path(__file__).resolve().parents[2] / "workspace.yaml"

TOKENS = {
    "c1": "EAAB0rotateTokenOne0123456789abcdef",
    "c2": "EAAB0rotateTokenTwo9876543210fedcba",
}
OLD_VAR = "RASTRO_OLD_SECRETS_KEY"


@pytest.fixture
def keys() -> dict[str, str]:
    return {"old": generate_key(), "new": generate_key()}


@pytest.fixture
def rastro_environ(duckdb_path: Path, keys: dict[str, str]) -> dict[str, str]:
    return {"RASTRO_DUCKDB_PATH": str(duckdb_path), ENV_VAR: keys["new"], OLD_VAR: keys["old"]}


@pytest.fixture
def never_printed() -> list[str]:
    return list(TOKENS.values())


def seal_connections(warehouse: Warehouse, now: datetime, sealers: dict[str, str]) -> None:
    """Store each connection's token sealed under the key `sealers[connection]`."""
    with warehouse.connect() as con:
        for connection_id, key in sealers.items():
            vault = Vault.from_env({ENV_VAR: key})
            registry.save_connection(
                con, connection_id, vault.seal(connection_id, TOKENS[connection_id]), now
            )


def stored_connections(warehouse: Warehouse) -> list[tuple]:
    with warehouse.connect(read_only=True) as con:
        return con.execute("SELECT * FROM meta_connections ORDER BY connection_id").fetchall()


def sealed_tokens(warehouse: Warehouse) -> dict[str, tuple[bytes, datetime]]:
    with warehouse.connect(read_only=True) as con:
        rows = con.execute(
            "SELECT connection_id, sealed_token, sealed_at FROM meta_connections"
        ).fetchall()
    return {connection_id: (bytes(sealed), sealed_at) for connection_id, sealed, sealed_at in rows}


def opens(key: str, connection_id: str, sealed: bytes) -> bool:
    try:
        opened = Vault.from_env({ENV_VAR: key}).open(connection_id, bytes(sealed))
    except SecretsKeyError:
        return False
    assert opened == TOKENS[connection_id]
    return True


# rotate-key -----------------------------------------------------------------


def test_rotate_key_reseals_every_token(rastro, warehouse: Warehouse, keys, now):
    seal_connections(warehouse, now, {"c1": keys["old"], "c2": keys["old"]})
    before = sealed_tokens(warehouse)
    code, out, err = rastro("rotate-key", "--old-key-env", OLD_VAR)
    assert (code, err) == (0, "")
    assert "re-sealed 2 tokens under" in out
    after = sealed_tokens(warehouse)
    assert sorted(after) == ["c1", "c2"]
    for connection_id, (sealed, sealed_at) in after.items():
        assert opens(keys["new"], connection_id, sealed)
        assert not opens(keys["old"], connection_id, sealed)
        # The token is the same, so its version is too: runs holding it stay current.
        assert sealed_at == before[connection_id][1]


def test_rotate_key_changes_nothing_when_a_token_opens_under_neither_key(
    rastro, warehouse: Warehouse, keys, now
):
    stranger = generate_key()
    seal_connections(warehouse, now, {"c1": keys["old"], "c2": stranger})
    before = stored_connections(warehouse)
    assert_usage_error(
        rastro("rotate-key", "--old-key-env", OLD_VAR), "'c2'", "nothing was changed"
    )
    assert stored_connections(warehouse) == before


def test_rotate_key_leaves_tokens_already_under_the_new_key(
    rastro, warehouse: Warehouse, keys, now
):
    seal_connections(warehouse, now, {"c1": keys["old"], "c2": keys["new"]})
    code, out, err = rastro("rotate-key", "--old-key-env", OLD_VAR)
    assert (code, err) == (0, "")
    assert "re-sealed 1 token under" in out
    assert "1 token was sealed under RASTRO_SECRETS_KEY already: c2" in out
    for connection_id, (sealed, _) in sealed_tokens(warehouse).items():
        assert opens(keys["new"], connection_id, sealed)
    # Again: nothing left to do, and that is no error.
    code, out, _ = rastro("rotate-key", "--old-key-env", OLD_VAR)
    assert code == 0 and "re-sealed 0 tokens under" in out


def test_rotate_key_without_a_warehouse_creates_none(rastro, duckdb_path: Path):
    code, out, _ = rastro("rotate-key", "--old-key-env", OLD_VAR)
    assert code == 0 and "no token to re-seal" in out
    assert not duckdb_path.exists()


@pytest.mark.parametrize(
    ("args", "environ", "fragments"),
    [
        (("--old-key-env", "NOT_SET"), {}, ("NOT_SET", "old key")),
        (("--old-key-env", OLD_VAR), {OLD_VAR: "bm90IGEga2V5"}, (OLD_VAR, "32 bytes")),
        (("--old-key-env", ENV_VAR), {}, ("holds the new key",)),
        (("--old-key-env", OLD_VAR), {ENV_VAR: ""}, (ENV_VAR, "not set")),
        ((), {}, ("--old-key-env",)),
    ],
)
def test_rotate_key_bad_input(rastro, warehouse: Warehouse, keys, now, args, environ, fragments):
    seal_connections(warehouse, now, {"c1": keys["old"]})
    before = stored_connections(warehouse)
    assert_usage_error(rastro("rotate-key", *args, environ=environ), *fragments)
    assert stored_connections(warehouse) == before


def test_rotate_key_refuses_the_same_key_twice(rastro, warehouse: Warehouse, keys, now):
    seal_connections(warehouse, now, {"c1": keys["old"]})
    result = rastro("rotate-key", "--old-key-env", OLD_VAR, environ={ENV_VAR: keys["old"]})
    assert_usage_error(result, "same key")


# fake-meta ------------------------------------------------------------------


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    calls: list[tuple] = []
    monkeypatch.setattr(
        server, "run_server", lambda port, world=None, host="": calls.append((port, host))
    )
    return calls


@pytest.mark.parametrize(
    ("host", "fragment"),
    [
        ("0.0.0.0", "not a loopback address"),
        ("::", "not a loopback address"),
        ("192.168.1.10", "not a loopback address"),
        ("example.com", "not an IP address"),
    ],
)
def test_fake_meta_binds_loopback_only(rastro, served, host, fragment):
    assert_usage_error(rastro("fake-meta", "--host", host), fragment, "loopback only")
    assert served == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), (server.DEFAULT_PORT, "127.0.0.1")),
        (("--port", "0", "--host", "localhost"), (0, "127.0.0.1")),
        (("--port", "9000", "--host", "::1"), (9000, "::1")),
        (("--host", "127.0.0.2"), (server.DEFAULT_PORT, "127.0.0.2")),
    ],
)
def test_fake_meta_serves(rastro, served, args, expected):
    assert rastro("fake-meta", *args)[0] == 0
    assert served == [expected]


def test_fake_meta_bad_port(rastro, served, monkeypatch):
    assert_usage_error(rastro("fake-meta", "--port", "70000"), "not a port number")

    def busy(port, world=None, host=""):
        raise OSError(98, "Address already in use")

    monkeypatch.setattr(server, "run_server", busy)
    assert_usage_error(rastro("fake-meta", "--port", "8765"), "Address already in use")


def test_fake_meta_default_port_is_the_servers():
    assert tools.FAKE_META_PORT == server.DEFAULT_PORT


# demo -----------------------------------------------------------------------


def test_demo_outside_the_repo_root(rastro, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_usage_error(rastro("demo"), "repo root")


def test_demo_hands_over_to_demo_run(rastro, tmp_path: Path, monkeypatch):
    (tmp_path / "workspace.yaml").write_text(REPO_WORKSPACE.read_text())
    (tmp_path / "dagster.yaml").write_text("{}\n")
    # From anywhere inside the checkout, the demo runs at its root.
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    calls = []
    monkeypatch.setattr(
        demo, "run", lambda root, extra, environ=None: calls.append((root, extra, environ)) or 0
    )
    assert rastro("demo", "--port", "3001", "--", "--log-level", "debug")[0] == 0
    [(root, extra, environ)] = calls
    assert root == tmp_path
    assert extra == ["--port", "3001", "--log-level", "debug"]
    assert environ[OLD_VAR]  # the command's environment, not os.environ
    assert rastro("demo")[0] == 0
    assert calls[-1][1] == []


def test_help_lists_the_tools(rastro, capsys: pytest.CaptureFixture[str]):
    assert rastro("--help")[0] == 0
    out = capsys.readouterr().out
    for name in ("rotate-key", "demo", "fake-meta"):
        assert name in out
