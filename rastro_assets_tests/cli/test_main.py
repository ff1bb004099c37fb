"""The console script itself: what every command shares at its entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rastro_assets.cli import EXIT_BROKEN_PIPE
from rastro_assets.warehouse import registry

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
        registry.add_site(con, "s1", None, now)
        registry.save_connection(con, "c1", b"\0" * 40, now)
        registry.link_account(con, "s1", "act_1", "c1", "UTC", "USD", now)
    env = {**os.environ, "RASTRO_DUCKDB_PATH": str(warehouse.path)}
    env.pop("DAGSTER_HOME", None)
    result = run_into_closed_pipe(args, env)
    assert result.stderr == ""
    assert result.returncode == EXIT_BROKEN_PIPE == 141
