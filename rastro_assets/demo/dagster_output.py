"""Which of Dagster's lines the demo passes on: its warnings and errors (or what
`--log-level` asks for), never the harmless ones it prints on every start, and a failure
raised on purpose as one line, without the stack of Dagster's frames that carried it."""

from __future__ import annotations

import logging
import re
import threading
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
# `dagster dev` stops when its daemon or webserver dies, and says so with a traceback of its
# own frames under this record; the demo says it in one line instead.
SERVICE_CRASH = "An unexpected exception has occurred"
SERVICE_DIED = re.compile(
    r"^Exception: (?P<service>dagster-daemon|dagster-webserver) process shut down"
    r" unexpectedly with return code (?P<code>-?\d+)"
)
# A crash record's lines held back at most: a traceback this long is passed on as it is.
CRASH_LINES = 200
# The events whose record goes on with the error that ended the step or the run.
ERROR_EVENT = re.compile(r" - (?P<event>STEP_FAILURE|RUN_FAILURE|RUN_CANCELED) - ")
# Errors raised on purpose, whose stack is only Dagster's frames between the op and the
# step: the product's `dg.Failure`, whose message is its own words (what failed, why, and
# the guide's section), and Dagster's interrupt of a run that is being stopped.
HANDLED_ERROR = re.compile(
    r"^dagster\._core\.(?:definitions\.events\.Failure"
    r"|errors\.DagsterExecutionInterruptedError)\b:? ?(?P<words>.*)"
)


class DagsterOutput:
    """Which of Dagster's lines on one stream the demo passes on: records at `threshold` or
    above (its warnings and errors by default) and every line that is no record (a
    traceback, a Python warning, a crash's last words), never a warning the demo has
    already explained. A record's further lines go with it, unless one starts an alarm.

    A step's or run's failure raised on purpose (`HANDLED_ERROR`) passes as one line, the
    record's and the failure's words; a run's failure that repeats its step's is not said
    again. Any other error (a crash) keeps its whole traceback, unless the demo is stopping.
    """

    def __init__(
        self, threshold: int = logging.WARNING, stopping: threading.Event | None = None
    ) -> None:
        self.threshold = threshold
        self.stopping = stopping or threading.Event()
        """Set once the user stopped the demo: from then on each record passes as its first
        line alone, and nothing else does. What Dagster prints while it stops its runs and
        services (an interrupted query's error, a process's KeyboardInterrupt) is the
        shutdown's, not something to act on."""
        self.hiding = False
        self.held: str | None = None
        """A failure's record, held until its error's first line says whether it was meant."""
        self.words = False
        """Passing on the further lines of a handled failure's words."""
        self.crash: list[str] | None = None
        """`dagster dev`'s crash record and its traceback so far, held until its last line."""
        self.service_died: str | None = None
        """Which of `dagster dev`'s services died, and how, once it said so."""

    def sift(self, line: str) -> list[str]:
        """The lines to pass on now that `line` came: none, `line`, or a held one first."""
        plain = COLOURS.sub("", line).rstrip("\r\n")
        record = LOG_RECORD.match(plain)
        if self.stopping.is_set():
            return self._while_stopping(line, record)
        if self.crash is not None:
            if record is None and len(self.crash) < CRASH_LINES:
                died = SERVICE_DIED.match(plain)
                if died is None:
                    self.crash.append(line)
                    return []
                self.crash = None
                self.service_died = (
                    f"its {died['service']} process exited with return code {died['code']}"
                )
                return []
            crash, self.crash = self.crash, None
            return [*crash, *self.sift(line)]
        before: list[str] = []
        if self.held is not None:
            if record is None and not plain.strip():
                return []  # the blank line between a failure's record and its error
            held, self.held = self.held, None
            if record is None:
                handled = HANDLED_ERROR.match(plain)
                if handled is None:
                    return [held, line]  # a crash: its traceback follows as Dagster wrote it
                shown = _one_line(held, handled["words"].strip())
                # The words' further lines go with the step's line, not with a repeat.
                self.hiding, self.words = True, bool(shown)
                return shown
            before = [held]
        if record is not None:
            level = logging.getLevelName(record["level"])
            below = isinstance(level, int) and level < self.threshold
            self.hiding = below or record["message"].startswith(EXPLAINED_WARNINGS)
            self.words = False
            if self.hiding:
                return before
            if ERROR_EVENT.search(record["message"]):
                self.held = line
                return before
            if record["message"].startswith(SERVICE_CRASH):
                self.crash = [line]
                return before
            return [*before, line]
        if self.words:
            if plain.strip():
                return [line]  # the failure's words go on over more lines
            self.words = False
        if self.hiding and not ALARM.match(plain):
            return []
        self.hiding = False
        return [line]

    def _while_stopping(self, line: str, record: re.Match | None) -> list[str]:
        held, self.held = self.held, None
        crash, self.crash = self.crash, None
        before = [first for first in (held, crash and crash[0]) if first]
        if record is None:
            return before
        level = logging.getLevelName(record["level"])
        if isinstance(level, int) and level < self.threshold:
            return before
        return [*before, line]

    def finish(self) -> list[str]:
        """What is still held when the stream ends."""
        held, self.held = self.held, None
        crash, self.crash = self.crash or [], None
        return [*([] if held is None else [held]), *crash]


def _one_line(record: str, words: str) -> list[str]:
    """A handled failure's record and its words as one line; none for a run's failure, which
    repeats the words of the step that failed it."""
    event = ERROR_EVENT.search(COLOURS.sub("", record))
    if event is not None and event["event"] == "RUN_FAILURE" and words:
        return []
    if not words:
        return [record]
    end = "\n" if record.endswith("\n") else ""
    return [f"{record.rstrip().removesuffix('.')}: {words}{end}"]


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

