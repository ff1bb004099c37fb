"""Which of Dagster's lines the demo passes on: its warnings and errors (or what
`--log-level` asks for), never the harmless ones it prints on every start."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

# Harmless warnings Dagster prints on every start of the demo, each matched by the start
# of its message (PYTHONWARNINGS takes no Dagster category without importing Dagster
# first): the `dagster dev` command superseded by `dg dev`, which needs a `dg` project;
# the preview and beta APIs the code location uses on purpose.
QUIETED_WARNINGS = (
    "Function `dev_command` is superseded",
    "Specifying a partitions_def on an AssetCheckSpec is currently in preview",
    "Parameter `owners` of initializer `SensorDefinition.__init__` is currently in beta",
)
# Dagster's INFO lines (each sensor tick, each backfill iteration) would bury the demo's own
# and "ready" with them; the UI keeps them. `--log-level` after `--` asks for more.
DAGSTER_LOG_LEVEL = "warning"
# A warning the demo answers in its own words before Dagster prints it: `dagster dev` sees
# the repo's dagster.yaml beside a DAGSTER_HOME elsewhere, where the demo copied it.
EXPLAINED_WARNINGS = ("Found a dagster instance configuration value (dagster.yaml)",)
# A Dagster log record as its console formatters print it (colours aside).
LOG_RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} - \S+ - (?P<level>[A-Z]+) - (?P<message>.*)"
)
COLOURS = re.compile(r"\x1b\[[0-9;]*m")
# Lines that start something to read whatever came before: a hidden record's message never
# swallows them.
ALARM = re.compile(
    r"^(Traceback \(most recent call last\)|\S*(Error|Exception|Warning)\b|\S+\.py:\d+: )"
)


class DagsterOutput:
    """Which of Dagster's lines on one stream the demo passes on: records at `threshold` or
    above (its warnings and errors by default) and every line that is no record (a
    traceback, a Python warning, a crash's last words), never a warning the demo has
    already explained. A record's further lines go with it, unless one starts an alarm."""

    def __init__(self, threshold: int = logging.WARNING) -> None:
        self.threshold = threshold
        self.hiding = False

    def keep(self, line: str) -> bool:
        plain = COLOURS.sub("", line)
        record = LOG_RECORD.match(plain)
        if record is not None:
            level = logging.getLevelName(record["level"])
            below = isinstance(level, int) and level < self.threshold
            self.hiding = below or record["message"].startswith(EXPLAINED_WARNINGS)
            return not self.hiding
        if self.hiding and not ALARM.match(plain):
            return False
        self.hiding = False
        return True


def dagster_log_level(extra_args: list[str]) -> tuple[list[str], int]:
    """`dagster dev`'s arguments with a log level (the user's, else warnings), and the level
    of the lines to pass on."""
    for index, arg in enumerate(extra_args):
        if arg == "--log-level" and index + 1 < len(extra_args):
            chosen = extra_args[index + 1]
        elif arg.startswith("--log-level="):
            chosen = arg.split("=", 1)[1]
        else:
            continue
        level = logging.getLevelName(chosen.upper())
        return extra_args, level if isinstance(level, int) else logging.WARNING
    return [*extra_args, "--log-level", DAGSTER_LOG_LEVEL], logging.WARNING


def quiet_warnings(environ: Mapping[str, str]) -> str:
    """PYTHONWARNINGS with the known harmless warnings ignored, the caller's entries kept."""
    ours = [f"ignore:{message}" for message in QUIETED_WARNINGS]
    theirs = [entry for entry in (environ.get("PYTHONWARNINGS") or "").split(",") if entry]
    return ",".join([*theirs, *ours])

