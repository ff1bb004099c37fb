"""`rastro demo`: the whole product on the fake Graph, from an empty `data/`.

Idempotent: the first start creates a demo-only secrets key, the warehouse,
two sites and three linked accounts of the fake Graph; later starts reuse
them. Then it becomes `dagster dev` (UI and daemon) on the repo's instance.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rastro_assets.meta.fake.world import DEMO_TOKEN, FakeWorld
from rastro_assets.vault import Vault, generate_key
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
        return self.data / "dagster"


def demo_key(paths: DemoPaths) -> str:
    """The demo's secrets key, made once and kept in data/ (demo only)."""
    paths.data.mkdir(parents=True, exist_ok=True)
    if not paths.key_file.exists():
        paths.key_file.write_text(generate_key() + "\n")
        paths.key_file.chmod(0o600)
    return paths.key_file.read_text().strip()


def prepare(paths: DemoPaths, now: datetime | None = None) -> dict[str, str]:
    """Create or reuse the demo data; return the environment Dagster runs with."""
    now = now or datetime.now(UTC)
    key = demo_key(paths)
    vault = Vault.from_env({"RASTRO_SECRETS_KEY": key})
    world = FakeWorld.demo()
    warehouse = Warehouse(paths.duckdb)
    warehouse.migrate()
    with warehouse.connect() as con:
        for site_id, name in DEMO_SITES.items():
            registry.add_site(con, site_id, name, now)
        connection = registry.get_connection(con, DEMO_CONNECTION)
        if connection is None or connection.status != "active":
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
    paths.dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(paths.root / "dagster.yaml", paths.dagster_home / "dagster.yaml")
    return {
        "RASTRO_SECRETS_KEY": key,
        "RASTRO_META_FAKE": "true",
        "RASTRO_DUCKDB_PATH": str(paths.duckdb),
        "DAGSTER_HOME": str(paths.dagster_home),
    }


def run(root: Path, extra_args: list[str]) -> int:
    """Prepare the demo, then replace this process with `dagster dev`."""
    paths = DemoPaths(root.resolve())
    if not (paths.root / "workspace.yaml").exists():
        print("rastro: error: run `rastro demo` from the repo root", file=sys.stderr)
        return 2
    env = {**os.environ, **prepare(paths)}
    os.chdir(paths.root)
    dagster = shutil.which("dagster", path=str(Path(sys.executable).parent)) or "dagster"
    print(f"rastro demo: data in {paths.data}; starting Dagster on http://127.0.0.1:3000")
    # A parent that ignores SIGINT/SIGTERM would hand that on through exec.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.execvpe(dagster, [dagster, "dev", "-w", "workspace.yaml", *extra_args], env)
    return 0
