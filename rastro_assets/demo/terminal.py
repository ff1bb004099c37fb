"""The demo's terminal: its own lines, and Dagster's passed on from other threads, each
written whole."""

from __future__ import annotations

import threading
from contextlib import suppress
from typing import IO

from rastro_assets.demo.dagster_output import DagsterOutput

PREFIX = "rastro demo:"

# The demo's own lines and Dagster's, passed on from other threads, stay whole lines.
_OUTPUT = threading.Lock()


def say(line: str) -> None:
    with _OUTPUT:
        print(f"{PREFIX} {line}", flush=True)


def relay(source: IO[bytes], sink: IO[str], output: DagsterOutput) -> None:
    """Pass `source`'s lines as `output` sifts them on to `sink`, until every writer closes
    it."""
    with source:
        for raw in iter(source.readline, b""):
            # Undecodable bytes survive the round trip: written as Dagster wrote them.
            for line in output.sift(raw.decode(errors="surrogateescape")):
                _write(sink, line.encode(errors="surrogateescape"))
        for line in output.finish():
            _write(sink, line.encode(errors="surrogateescape"))


def _write(sink: IO[str], line: bytes) -> None:
    whole = line if line.endswith(b"\n") else line + b"\n"
    with _OUTPUT, suppress(OSError, ValueError):
        sink.flush()
        # As Dagster wrote them: no encoding of the terminal's may mangle or drop them.
        binary = getattr(sink, "buffer", None)
        if binary is not None:
            binary.write(whole)
            binary.flush()
        else:
            sink.write(whole.decode(errors="replace"))
            sink.flush()

