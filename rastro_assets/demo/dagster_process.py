"""Dagster as the demo's child: in a process group of its own, creating every file private,
stopped on SIGINT/SIGTERM after its runs in flight are canceled, and killed when it does not
stop in time."""

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
from rastro_assets.demo.terminal import relay, say
from rastro_assets.demo.watch import Watcher

# Added to the caller's umask for Dagster: no group or other bits on anything it creates.
PRIVATE_UMASK = 0o077
# Stopping Dagster waits this long for its last lines to be passed on.
RELAY_DRAIN_SECONDS = 5.0
TICK_SECONDS = 2.0
# How often the demo looks whether Dagster exited, or a signal came.
POLL_SECONDS = 0.25
# Stopping Dagster takes a few seconds; after this long the demo gives up waiting.
STOP_SECONDS = 25.0
# Canceling the runs in flight loads Dagster first: after this long Dagster is stopped anyway.
CANCEL_SECONDS = 15.0
# What `dagster dev` leaves behind gets this long to exit.
LEFTOVER_SECONDS = 10.0


def supervise(
    argv: list[str],
    env: Mapping[str, str],
    watcher: Watcher,
    output: DagsterOutput | None = None,
    stop_runs: list[str] | None = None,
) -> int:
    """Run `argv` in a process group of its own, under a umask denying group and others; watch
    meanwhile; on SIGINT or SIGTERM, stop it quietly.

    Its own group, so that Ctrl-C in a terminal reaches Dagster once, from here, and only
    `dagster dev` itself: it stops its daemon and webserver before its code server, which
    ends once the runs in flight have. Those are first stopped by `stop_runs` (a command
    that marks each canceled by the user and asks its worker to stop), or they would run on,
    or die as failures. A second signal hands the first on at once; a third kills the group.
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
    quieting = threading.Event()
    sifters = [DagsterOutput(output.threshold, quieting) for _ in range(2)] if output else []
    relays = _start_relays(child, sifters)
    signals: list[int] = []

    def note(signum: int, _frame) -> None:
        signals.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    stopping = _Stopping(child, env, stop_runs, signals, quieting)
    try:
        code = stopping.wait(watcher)
    finally:
        _end_group(child.pid)
        stopping.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        drained_by = time.monotonic() + RELAY_DRAIN_SECONDS
        for thread in relays:
            thread.join(max(drained_by - time.monotonic(), 0))
    if signals:
        say("stopped")
    else:
        why = next((s.service_died for s in sifters if s.service_died), None)
        say(
            f"Dagster stopped on its own ({why or f'exit code {code}'}), and the UI with it:"
            " `rastro demo` starts it again"
        )
        code = code or 1
    return 128 - code if code < 0 else code


def _start_relays(
    child: subprocess.Popen, sifters: list[DagsterOutput]
) -> list[threading.Thread]:
    """A thread for each of the child's stdout and stderr, each sifting its lines with its
    own of `sifters` (none: the child's streams are the demo's own)."""
    relays = []
    streams = ((child.stdout, sys.stdout), (child.stderr, sys.stderr))
    for (source, sink), sifter in zip(streams, sifters, strict=False):
        # Daemon threads: a run worker that outlives Dagster may hold the pipe open.
        thread = threading.Thread(target=relay, args=(source, sink, sifter), daemon=True)
        thread.start()
        relays.append(thread)
    return relays


class _Stopping:
    """Dagster running, then stopping once a signal came: the runs in flight canceled, the
    first signal handed on, and the group killed if it outlives `STOP_SECONDS`."""

    def __init__(
        self,
        child: subprocess.Popen,
        env: Mapping[str, str],
        stop_runs: list[str] | None,
        signals: list[int],
        quieting: threading.Event,
    ) -> None:
        self.child = child
        self.quieting = quieting
        self.env = env
        self.stop_runs = stop_runs
        self.signals = signals
        self.canceller: _Canceller | None = None
        self.handed_on = False
        self.deadline: float | None = None

    def wait(self, watcher: Watcher) -> int:
        """The child's exit code. The watcher looks every tick until a signal comes."""
        next_tick = time.monotonic()
        while True:
            try:
                return self.child.wait(timeout=POLL_SECONDS)
            except subprocess.TimeoutExpired:
                pass
            if self.signals:
                self.stop()
            elif time.monotonic() >= next_tick:
                watcher.tick()
                next_tick = time.monotonic() + TICK_SECONDS

    def close(self) -> None:
        """Dagster is gone: the canceller's last pass."""
        if self.canceller is not None:
            self.canceller.close()

    def stop(self) -> None:
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + STOP_SECONDS
            self.quieting.set()
            say("stopping: the runs in flight are canceled, then Dagster stops")
            if self.stop_runs:
                self.canceller = _Canceller(self.stop_runs, self.env)
        swept = self.canceller is None or self.canceller.swept(now)
        if not self.handed_on and (swept or len(self.signals) > 1):
            self.handed_on = True
            with suppress(ProcessLookupError):
                os.kill(self.child.pid, self.signals[0])
        if now >= self.deadline or len(self.signals) > 2:
            with suppress(ProcessLookupError):
                os.killpg(self.child.pid, signal.SIGKILL)


class _Canceller:
    """The command stopping the runs in flight, its lines said as the demo's own."""

    def __init__(self, argv: list[str], env: Mapping[str, str]) -> None:
        self.started = time.monotonic()
        self.done = threading.Event()
        self.process = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            process_group=0,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            words = line.split()
            if words == ["swept"]:
                self.done.set()
            elif len(words) == 3 and words[0] == "canceled":
                say(f"run {words[1][:8]} ({words[2]}) canceled: stopped by the user")
            elif len(words) == 4 and words[0] == "ended":
                say(f"run {words[1][:8]} ({words[2]}) ended {words[3].lower()} before the stop"
                    " reached it")
        self.done.set()

    def swept(self, now: float) -> bool:
        """Whether the runs in flight when it started are canceled, or it took too long."""
        return self.done.is_set() or now - self.started >= CANCEL_SECONDS

    def close(self) -> None:
        """Stop sweeping, Dagster and its daemon being gone, and end what is still canceling."""
        with suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout=CANCEL_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        # Its last lines say how the runs it stopped ended: said before the demo's "stopped".
        self.reader.join(RELAY_DRAIN_SECONDS)


def _end_group(pgid: int) -> None:
    """What is left of Dagster's group once `dagster dev` is gone (a code server waiting out
    a run, a run worker) has `LEFTOVER_SECONDS` to exit, and is killed after."""
    deadline = time.monotonic() + LEFTOVER_SECONDS
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(POLL_SECONDS)
    with suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


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

