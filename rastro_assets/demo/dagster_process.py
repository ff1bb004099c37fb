"""Dagster as the demo's child: in a process group of its own, creating every file private,
handed each SIGINT/SIGTERM, and killed when it does not stop in time."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from contextlib import suppress

from rastro_assets.demo.dagster_output import DagsterOutput
from rastro_assets.demo.terminal import relay
from rastro_assets.demo.watch import Watcher

# Added to the caller's umask for Dagster: no group or other bits on anything it creates.
PRIVATE_UMASK = 0o077
# Stopping Dagster waits this long for its last lines to be passed on.
RELAY_DRAIN_SECONDS = 5.0
TICK_SECONDS = 2.0
# Stopping Dagster takes a few seconds; after this long the demo gives up waiting.
STOP_SECONDS = 25.0


def supervise(
    argv: list[str],
    env: Mapping[str, str],
    watcher: Watcher,
    output: DagsterOutput | None = None,
) -> int:
    """Run `argv` in a process group of its own, under a umask denying group and others; hand
    it each SIGINT/SIGTERM, watch meanwhile.

    Its own group, so that a signal to the demo's group (Ctrl-C in a terminal) reaches
    Dagster once, from here: twice, `dagster dev` aborts its own shutdown halfway.
    With `output`, its stdout and stderr pass through here, each sifted on its own
    (`DagsterOutput`); without, they are the demo's own.
    """
    piped = subprocess.PIPE if output is not None else None
    child = subprocess.Popen(
        argv,
        env=env,
        process_group=0,
        preexec_fn=_start_child,
        stdout=piped,
        stderr=piped,
    )
    relays = _start_relays(child, output) if output is not None else []
    stopping: list[int] = []

    def hand_on(signum: int, _frame) -> None:
        stopping.append(signum)
        with suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    previous = {sig: signal.signal(sig, hand_on) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = _wait(child, watcher, stopping)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        drained_by = time.monotonic() + RELAY_DRAIN_SECONDS
        for thread in relays:
            thread.join(max(drained_by - time.monotonic(), 0))
    return 128 - code if code < 0 else code


def _start_relays(child: subprocess.Popen, output: DagsterOutput) -> list[threading.Thread]:
    """A thread for each of the child's stdout and stderr, each sifting its lines on its own."""
    relays = []
    for source, sink in ((child.stdout, sys.stdout), (child.stderr, sys.stderr)):
        sifter = DagsterOutput(output.threshold)
        # Daemon threads: a run worker that outlives Dagster may hold the pipe open.
        thread = threading.Thread(target=relay, args=(source, sink, sifter), daemon=True)
        thread.start()
        relays.append(thread)
    return relays


def _wait(child: subprocess.Popen, watcher: Watcher, stopping: list[int]) -> int:
    """The child's exit code. The watcher looks every tick until a signal is handed on; from
    then on the child has `STOP_SECONDS` to stop, and is killed after."""
    deadline: float | None = None
    while True:
        try:
            return child.wait(timeout=TICK_SECONDS)
        except subprocess.TimeoutExpired:
            pass
        if stopping:
            deadline = deadline or time.monotonic() + STOP_SECONDS
            if time.monotonic() >= deadline:
                with suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                return child.wait()
            continue
        watcher.tick()


def _start_child() -> None:
    """In the child before exec: die with the demo, and create every file private.

    Dagster creates its storage, run logs and directories with the process umask
    (under umask 000: logs 0666, directories 0777); `dagster dev` and every process it
    starts (daemon, webserver, code server, run workers) inherit this one.
    """
    _die_with_parent()
    os.umask(os.umask(PRIVATE_UMASK) | PRIVATE_UMASK)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the demo dies, even by SIGKILL (Linux); and
    SIGINT and SIGTERM at their defaults, since a demo started in the background of a
    script inherits SIGINT ignored, and Dagster would then never get the Ctrl-C handed on."""
    for handed_on in (signal.SIGINT, signal.SIGTERM):
        signal.signal(handed_on, signal.SIG_DFL)
    with suppress(OSError, AttributeError):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)

