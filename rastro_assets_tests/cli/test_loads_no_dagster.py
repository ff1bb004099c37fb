"""`rastro` loads Dagster only for the commands that need it: reading or changing the Dagster
instance (`link` and `accounts link` with DAGSTER_HOME set, `status --check` with it,
`shard move`) and serving it (`webserver`). Every other command, and `rastro --help`,
which loads every command's module, starts without it (loading it costs over a second)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from rastro_assets.warehouse import link_store, registry, site_store

# Runs each command in one fresh interpreter, in turn, as the console script runs it, and
# writes down the Dagster modules each one loaded first.
HARNESS = """
import json, sys
from rastro_assets.cli import main

def dagster_modules():
    return {name for name in sys.modules if name.split(".")[0].startswith("dagster")}

out, commands = sys.argv[1], json.loads(sys.argv[2])
loaded = {}
for argv in commands:
    before = dagster_modules()
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    loaded[" ".join(argv)] = {"code": code, "dagster": sorted(dagster_modules() - before)}
with open(out, "w") as file:
    json.dump(loaded, file)
"""

COMMANDS = [["--help"], ["status"], ["status", "--json"], ["plan"], ["site", "list"], ["shard"]]


def test_help_and_the_commands_on_the_warehouse_load_no_dagster(
    warehouse, now: datetime, tmp_path: Path
):
    with warehouse.connect() as con:  # closed before the commands take the file
        site_store.add_site(con, "s1", None, now)
        registry.save_connection(con, "c1", b"\0" * 40, now)
        link_store.link_account(con, "s1", "act_1", "c1", "America/Sao_Paulo", "BRL", now)
    report = tmp_path / "loaded.json"
    env = {
        **{k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"},
        "RASTRO_DUCKDB_PATH": str(warehouse.path),
    }
    subprocess.run(
        [sys.executable, "-c", HARNESS, str(report), json.dumps(COMMANDS)],
        env=env, check=True, timeout=120, capture_output=True,
    )
    loaded = json.loads(report.read_text())
    assert {command: run["code"] for command, run in loaded.items()} == {
        " ".join(command): 0 for command in COMMANDS
    }
    assert {command: run["dagster"][:5] for command, run in loaded.items() if run["dagster"]} == {}
