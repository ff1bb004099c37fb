"""`rastro demo`: the whole product on the fake Graph, from an empty `data/`.

Idempotent: the first start creates a demo-only secrets key, the warehouse,
two sites and three linked accounts of the fake Graph; later starts reuse
them. Then it becomes `dagster dev` (UI and daemon) on the repo's instance,
with a persistent Dagster home in `data/dagster_home`.

A `RASTRO_SECRETS_KEY` already in the environment wins over the demo key in
`data/secrets.key`: whoever keeps real connections in the same warehouse
keeps them readable. The demo connection is re-sealed whenever the key in use
does not open it.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import duckdb

from rastro_assets.meta.fake.world import DEMO_TOKEN, FakeWorld
from rastro_assets.outcomes import ConnectionStatus
from rastro_assets.vault import ENV_VAR, SecretsKeyError, Vault, generate_key
from rastro_assets.warehouse import registry
from rastro_assets.warehouse.connection import Warehouse

DEMO_CONNECTION = "demo"
DEMO_SITES = {"demo-shop": "Demo shop", "demo-clinic": "Demo clinic"}
DEMO_LINKS = {"demo-shop": ("act_1001", "act_1002"), "demo-clinic": ("act_1002", "act_1003")}


@dataclass(frozen=True)
class DemoPaths:
    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def key_file(self) -> Path:
        return self.data / "secrets.key"

    @property
    def duckdb(self) -> Path:
        return self.data / "rastro.duckdb"

    @property
    def dagster_home(self) -> Path:
        return self.data / "dagster_home"


def demo_key(paths: DemoPaths) -> str:
    """The demo's secrets key, made once and kept in data/ (demo only), readable by its owner."""
    # Private from its creation: it holds the key, the warehouse and Dagster's home.
    paths.data.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not paths.key_file.exists():
        # Created with its final mode: the key is never readable by others, not even briefly.
        fd = os.open(paths.key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(generate_key() + "\n")
    return paths.key_file.read_text().strip()


def prepare(
    paths: DemoPaths, now: datetime | None = None, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Create or reuse the demo data; return the environment Dagster runs with."""
    now = now or datetime.now(UTC)
    environ = os.environ if environ is None else environ
    key = (environ.get(ENV_VAR) or "").strip() or demo_key(paths)
    vault = Vault.from_env({ENV_VAR: key})
    world = FakeWorld.demo()
    warehouse = Warehouse(paths.duckdb)
    with warehouse.connect() as con:
        for site_id, name in DEMO_SITES.items():
            if not registry.site_exists(con, site_id):
                registry.add_site(con, site_id, name, now)
        if not _demo_token_stored(con, vault):
            registry.save_connection(
                con, DEMO_CONNECTION, vault.seal(DEMO_CONNECTION, DEMO_TOKEN), now
            )
        for site_id, accounts in DEMO_LINKS.items():
            for ad_account_id in accounts:
                account = world.accounts[ad_account_id]
                registry.link_account(
                    con,
                    site_id,
                    ad_account_id,
                    DEMO_CONNECTION,
                    account.timezone,
                    account.currency,
                    now,
                    name=account.name,
                )
    paths.dagster_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    # The repo's instance config, refreshed on every start; its relative paths
    # (data/dagster/...) resolve from the repo root, where Dagster runs.
    shutil.copyfile(paths.root / "dagster.yaml", paths.dagster_home / "dagster.yaml")
    return {
        ENV_VAR: key,
        "RASTRO_META_FAKE": "true",
        "RASTRO_DUCKDB_PATH": str(paths.duckdb),
        "DAGSTER_HOME": str(paths.dagster_home),
        # Someone trying the demo waits for their first query: publish within a minute.
        "RASTRO_ANALYTICS_LAG_SECONDS": environ.get("RASTRO_ANALYTICS_LAG_SECONDS") or "60",
    }


def _demo_token_stored(con: duckdb.DuckDBPyConnection, vault: Vault) -> bool:
    """Whether the demo connection is active and `vault` opens its token as the demo token."""
    connection = registry.get_connection(con, DEMO_CONNECTION)
    if connection is None or not connection.sealed_token:
        return False
    if connection.status != ConnectionStatus.ACTIVE:
        return False
    try:
        return vault.open(DEMO_CONNECTION, connection.sealed_token) == DEMO_TOKEN
    except SecretsKeyError:
        return False


def run(root: Path, extra_args: list[str], environ: Mapping[str, str] | None = None) -> int:
    """Prepare the demo, then replace this process with `dagster dev`."""
    paths = DemoPaths(root.resolve())
    if not (paths.root / "workspace.yaml").exists():
        print("rastro: error: run `rastro demo` from the repo root", file=sys.stderr)
        return 2
    base = dict(os.environ if environ is None else environ)
    env = {**base, **prepare(paths, environ=base)}
    os.chdir(paths.root)
    dagster = shutil.which("dagster", path=str(Path(sys.executable).parent)) or "dagster"
    print(
        f"rastro demo: data in {paths.data}; starting Dagster (UI and daemon) on"
        f" http://127.0.0.1:{_port(extra_args)}",
        flush=True,
    )
    # A parent that ignores SIGINT/SIGTERM would hand that on through exec.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.execvpe(dagster, [dagster, "dev", "-w", "workspace.yaml", *extra_args], env)
    return 0


def _port(extra_args: list[str]) -> str:
    for flag in ("--port", "-p"):
        if flag in extra_args[:-1]:
            return extra_args[extra_args.index(flag) + 1]
    return "3000"
