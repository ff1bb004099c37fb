"""Every command an incident, the probe or the runbook tells a person to run works as written:
each `rastro` command parses with the real parser, and the command that turns a stopped
sensor on is run, as the incident words it, against a real Dagster home from the checkout."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest
import yaml

from rastro_assets.cli import build_parser
from rastro_assets.cli.context import UsageError
from rastro_assets.defs.cadence.incidents import sensor_incidents
from rastro_assets.settings import AlertThresholds
from rastro_assets_tests.e2e.daemon_harness import instance_yaml

REPO = Path(__file__).resolve().parents[2]
SOURCES = [
    REPO / "rastro_assets" / "alerts" / "incidents.py",
    REPO / "rastro_assets" / "cli" / "check.py",
    REPO / "rastro_assets" / "defs" / "cadence" / "incidents.py",
]
RUNBOOK = REPO / "docs" / "errors.md"
# What a person puts in place of each placeholder the texts use.
FILLED = {
    "{connection}": "c1",
    "<connection>": "c1",
    "CONNECTION_ID": "c1",
    "AD_ACCOUNT_ID": "act_1",
    "SITE_ID": "s1",
    "act_…": "act_1",
}
COMMAND = re.compile(r"`(rastro [^`]*)`")


def filled(text: str) -> str:
    for placeholder, value in FILLED.items():
        text = text.replace(placeholder, value)
    return text


def parses(command: str) -> None:
    words = shlex.split(filled(command))
    assert words[0] == "rastro"
    args = build_parser().parse_args(words[1:])
    assert args.handler is not None


def test_every_rastro_command_an_incident_names_parses_as_written():
    commands = sorted({span for path in SOURCES for span in COMMAND.findall(path.read_text())})
    assert "rastro connect {connection}" in commands
    assert "rastro sync-now AD_ACCOUNT_ID" in commands
    for command in commands:
        parses(command)


def test_every_rastro_command_of_the_runbook_names_a_real_command():
    subcommands = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001
    for command in sorted(set(COMMAND.findall(RUNBOOK.read_text()))):
        words = shlex.split(filled(command))
        assert words[1] in subcommands, command
        try:
            build_parser().parse_args(words[1:])
        except UsageError as exc:
            # A command named without its arguments (`rastro connect`) is a name, not a fix.
            assert "required" in str(exc), (command, exc)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_yaml(home)))
    return home


def dagster(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "dagster"), *args, "-w", "workspace.yaml"],
        cwd=REPO, env={**os.environ, "DAGSTER_HOME": str(home)}, capture_output=True,
        text=True, timeout=60, check=True,
    )


@pytest.mark.slow
def test_the_stopped_sensor_s_fix_turns_it_on_as_written_from_the_checkout(home: Path):
    dagster(home, "sensor", "stop", "meta_cadence")
    now = datetime.now(UTC)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        [stopped] = sensor_incidents(instance, now, AlertThresholds())
    assert stopped.key == "sensor:meta_cadence"
    [command] = re.findall(r"from the checkout: `([^`]*)`", stopped.fix)
    assert command == (
        f"DAGSTER_HOME={shlex.quote(str(home))} dagster sensor start meta_cadence -w "
        "workspace.yaml"
    )
    # As a person runs it: a shell in the checkout, with no DAGSTER_HOME of its own.
    environment = {
        name: value for name, value in os.environ.items() if name != "DAGSTER_HOME"
    }
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"
    done = subprocess.run(
        ["sh", "-c", command], cwd=REPO, env=environment, capture_output=True, text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Started sensor meta_cadence" in done.stdout
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert sensor_incidents(instance, now, AlertThresholds()) == []
