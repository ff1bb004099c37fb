"""The process-wide pacer: how many Graph requests may be in flight, and what must wait.

Every `GraphSession` of a process asks one `Pacer` (`default_pacer()`; a forked child makes
its own) around each Graph request, so the rules hold for the process as a whole whatever
the number of clients, accounts and threads, and the same in every run worker (they depend
only on Meta's answers):

- **The app's load**, every token of the app together: its insights load per second
  (`app_id_util_pct`), which binds every request, and its platform calls an hour
  (`X-App-Usage`), which binds only platform calls (no account): the latest reading of
  each, forgotten after `APP_READING_MAX_AGE_SECONDS`. Below `APP_LOAD_SLOW_PCT` nothing is
  limited beyond the callers' own threads. Above it, the requests in flight in the process,
  and those of each token, may be no more than a share of the most the process (or token)
  has had in flight: all of it at `APP_LOAD_SLOW_PCT`, one at 100 %, linearly between. They
  grow back as the readings fall.
- **The app's throttle** (code 4: `app_insights_load`, or the platform's `app_platform`):
  every request of the process waits `APP_PAUSE_FIRST_SECONDS`, then twice as long after
  each refusal of a request sent after the pause, up to `APP_PAUSE_MAX_SECONDS`, with
  jitter. After a pause one request goes alone, and the others follow once it is answered
  (then the doubling starts over): a process whose every request waited does not send them
  all into the same refusal.
- **An account's own limit** (an answer at `ACCOUNT_HOLD_PCT` or more of it, or the
  account's own throttle): that account alone is held for max(regain time,
  `reset_time_duration`, `ACCOUNT_HOLD_MIN_SECONDS`) with jitter. Its requests, from any
  session of the process, wait a hold no longer than `ACCOUNT_WAIT_IN_RUN_SECONDS` and go
  on; a longer one is the planner's to keep (the session raises the throttle, the sync
  ends `throttled`). Other accounts' requests never wait for it.
- **Abuse** (613 without a subcode) is never waited for here: the account's quota was cut
  for hours.

The pacer only decides; the session does the waiting, with its own injected `sleep`, and
never while holding the pacer's lock.
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rastro_assets.meta.errors import MetaError
from rastro_assets.meta.limits import ACCOUNT_LIMITS, RateLimit
from rastro_assets.meta.models import Usage

APP_LOAD_SLOW_PCT = 75.0
APP_LOAD_FULL_PCT = 100.0
APP_READING_MAX_AGE_SECONDS = 30.0
"""A reading of the app's load older than this says nothing of now: Meta measures it per
second, and a process that stopped asking has no newer one."""
IN_FLIGHT_BASE_MAX = 64
"""The most requests in flight the slowing down starts from: a wave's accounts times the
ranges each reads side by side. Below it, the most the process (or token) has had in flight."""
SLOT_RECHECK_SECONDS = 1.0
"""How often a request waiting for room looks again, so that a reading that aged out frees it
even when no request ends meanwhile."""

APP_PAUSE_FIRST_SECONDS = 60.0
APP_PAUSE_MAX_SECONDS = 15 * 60.0
ACCOUNT_HOLD_PCT = 90.0
ACCOUNT_HOLD_MIN_SECONDS = 60
ACCOUNT_WAIT_IN_RUN_SECONDS = 5 * 60.0
"""The longest an account's requests wait for its own limit within a run (all the holds one
request meets together); past it the sync ends throttled and the planner holds the account."""
IN_RUN_WAIT_MAX_SECONDS = 45 * 60.0
"""The longest one request waits for the app's throttle: every step of the back-off (1 + 2 +
4 + 8 + 15 minutes, jitter included) once; past it the sync ends throttled."""
JITTER = 0.2
"""Holds and pauses last up to this share longer, so that the accounts and processes held
together do not all ask again in the same second."""

APP_PAUSE_CODE = 4
# An account's own throttle holds that account; abuse is held by the planner for hours.
HELD_IN_PROCESS = ACCOUNT_LIMITS - {RateLimit.ABUSE}


@dataclass(frozen=True, slots=True)
class Hold:
    """A wait the pacer asks of requests: one account's, or every request's (`app`)."""

    limit: str
    until: float  # on the pacer's clock, jitter included
    seconds: int  # without the jitter: max(regain, reset, the minimum), what the planner is told
    in_run: bool  # short enough to wait within the run
    app: bool = False


class HoldAhead(Exception):
    """A hold began after the request last looked: it goes back to wait it out (a signal
    between the pacer and the session, never raised past the session)."""


class Attempt:
    """One request's dealings with the pacer: the holds it waited out, and the app's pauses
    begun by the time it went."""

    __slots__ = ("pause_seen", "through")

    def __init__(self) -> None:
        self.through = -math.inf  # the end of the latest hold it waited out (pacer's clock)
        self.pause_seen = 0  # the app's pauses begun when it was sent


class Pacer:
    """What every Graph request of a process waits for, and how many may be in flight.

    Args:
        in_flight_base_max: the most in flight the slowing down starts from.
        monotonic: the clock holds and readings are kept on (tests pin it).
        rng: the jitter's source (tests seed it).
    """

    def __init__(
        self,
        *,
        in_flight_base_max: int = IN_FLIGHT_BASE_MAX,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if in_flight_base_max < 1:
            raise ValueError("in_flight_base_max must be at least 1")
        self.monotonic = monotonic
        self._base_max = in_flight_base_max
        self._random = rng or random.Random()
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._in_flight = 0
        self._peak = 0
        self._token_in_flight: defaultdict[str, int] = defaultdict(int)
        self._token_peak: defaultdict[str, int] = defaultdict(int)
        # The latest reading of the app's insights load, and of its platform calls: (pct, when).
        self._insights_load = (0.0, -math.inf)
        self._platform_load = (0.0, -math.inf)
        self._holds: dict[str, Hold] = {}
        self._pause: Hold | None = None
        self._pauses = 0  # the app's pauses begun so far
        self._pause_step = 0  # pauses since the app last answered; while any, one at a time

    def __repr__(self) -> str:
        return f"Pacer(in_flight={self._in_flight}, insights_load={self._insights_load[0]:g})"

    def now(self) -> float:
        return self.monotonic()

    # -- the app's load: requests in flight ------------------------------------------

    def allowed_in_flight(self, token: str | None = None, *, platform: bool = False) -> int | None:
        """The requests that may be in flight now (of `token`, when given; platform calls,
        when `platform`); None: no limit."""
        with self._lock:
            peak = self._token_peak[token] if token is not None else self._peak
            return self._allowed(peak, platform)

    def _load(self, platform: bool) -> float:
        now = self.monotonic()
        readings = [self._insights_load, self._platform_load] if platform else [
            self._insights_load]
        return max((pct for pct, at in readings if now - at <= APP_READING_MAX_AGE_SECONDS),
                   default=0.0)

    def _allowed(self, peak: int, platform: bool) -> int | None:
        if self._pause_step:
            return 1  # after the app's pause, one request finds out whether it is over
        load = self._load(platform)
        if load < APP_LOAD_SLOW_PCT:
            return None
        base = max(1, min(self._base_max, peak))
        left = max(0.0, APP_LOAD_FULL_PCT - load) / (APP_LOAD_FULL_PCT - APP_LOAD_SLOW_PCT)
        return max(1, math.floor(1 + (base - 1) * left))

    def _has_room(self, token: str, platform: bool) -> bool:
        process = self._allowed(self._peak, platform)
        own = self._allowed(self._token_peak[token], platform)
        return (process is None or self._in_flight < process) and (
            own is None or self._token_in_flight[token] < own
        )

    @contextmanager
    def slot(self, token: str, account: str | None, attempt: Attempt) -> Iterator[None]:
        """Hold one of the requests in flight (of the process and of `token`) while inside.

        `HoldAhead` when, meanwhile, a hold began that `attempt` has not waited out.
        """
        with self._room:
            while True:
                hold = self._ahead(account)
                if hold is not None and hold.until > attempt.through:
                    raise HoldAhead
                if self._has_room(token, platform=account is None):
                    break
                self._room.wait(SLOT_RECHECK_SECONDS)
            attempt.pause_seen = self._pauses
            self._in_flight += 1
            self._token_in_flight[token] += 1
            self._peak = max(self._peak, self._in_flight)
            self._token_peak[token] = max(self._token_peak[token], self._token_in_flight[token])
        try:
            yield
        finally:
            with self._room:
                self._in_flight -= 1
                self._token_in_flight[token] -= 1
                self._room.notify_all()

    def read_app_load(self, insights: float | None, platform: float | None = None) -> None:
        """The app's share of its insights load and of its platform calls, as an answer just
        said them (None: it said nothing of that one)."""
        if insights is None and platform is None:
            return
        with self._room:
            now = self.monotonic()
            if insights is not None:
                self._insights_load = (insights, now)
            if platform is not None:
                self._platform_load = (platform, now)
            self._room.notify_all()

    # -- holds and pauses --------------------------------------------------------

    def ahead(self, account: str | None) -> Hold | None:
        """The hold a request for `account` (None: no account) must wait out, if any: the
        later of the app's pause and the account's own hold."""
        with self._lock:
            return self._ahead(account)

    def _ahead(self, account: str | None) -> Hold | None:
        now = self.monotonic()
        pending = [self._pause] if self._pause is not None and self._pause.until > now else []
        if account is not None:
            hold = self._holds.get(account)
            if hold is not None and hold.until > now:
                pending.append(hold)
            elif hold is not None:
                del self._holds[account]
        return max(pending, key=lambda hold: hold.until, default=None)

    def answered(self, account: str | None, usage: Usage, attempt: Attempt) -> Hold | None:
        """Learn from an answer to `attempt` that was no throttle.

        Returns the hold it puts on `account` when the account's own usage reached
        `ACCOUNT_HOLD_PCT` (a long one is not kept here: the caller ends the read).
        """
        with self._room:
            if self._pause_step and attempt.pause_seen == self._pauses:
                # Sent after the latest pause, and answered: the app takes requests again.
                self._pause_step = 0
                self._room.notify_all()
        if account is None or usage.account_pct < ACCOUNT_HOLD_PCT:
            return None
        limit = usage.limit if usage.limit in HELD_IN_PROCESS else RateLimit.ADS_MANAGEMENT
        return self._hold_account(account, limit, usage.regain_seconds, usage.reset_seconds)

    def throttled(self, account: str | None, error: MetaError, attempt: Attempt) -> Hold | None:
        """What Meta's throttle `error` of `attempt` holds, or None when no wait here helps
        (abuse, or a limit the product cannot pace to): the request fails as it is."""
        if error.code == APP_PAUSE_CODE and error.limit in (
            RateLimit.APP_INSIGHTS_LOAD, RateLimit.APP_PLATFORM
        ):
            return self._pause_app(error.limit, attempt)
        if account is not None and error.limit in HELD_IN_PROCESS:
            return self._hold_account(account, error.limit, error.regain_seconds, None)
        return None

    def _jittered(self, seconds: float) -> float:
        # In (1, 1 + JITTER]: never shorter than Meta's own wait.
        return seconds * (1.0 + JITTER * (1.0 - self._random.random()))

    def _hold_account(
        self, account: str, limit: str, regain: int | None, reset: int | None
    ) -> Hold:
        seconds = max(regain or 0, reset or 0, ACCOUNT_HOLD_MIN_SECONDS)
        with self._lock:
            wait = self._jittered(seconds)
            hold = Hold(limit, self.monotonic() + wait, seconds,
                        in_run=wait <= ACCOUNT_WAIT_IN_RUN_SECONDS)
            if hold.in_run:
                held = self._holds.get(account)
                if held is None or held.until < hold.until:
                    self._holds[account] = hold
            return hold

    def _pause_app(self, limit: str, attempt: Attempt) -> Hold:
        with self._lock:
            pause = self._pause
            if pause is not None and attempt.pause_seen < self._pauses:
                # Sent before the latest pause began: that pause answers it too.
                return pause
            seconds = min(APP_PAUSE_MAX_SECONDS, APP_PAUSE_FIRST_SECONDS * 2**self._pause_step)
            self._pause_step += 1
            self._pauses += 1
            until = self.monotonic() + self._jittered(seconds)
            if pause is not None:
                until = max(until, pause.until)
            self._pause = Hold(limit, until, math.ceil(seconds), in_run=True, app=True)
            return self._pause


_default: Pacer | None = None
_default_pid: int | None = None
_default_lock = threading.Lock()


def default_pacer() -> Pacer:
    """The process's pacer, made on first use; a forked child makes its own."""
    global _default, _default_pid
    with _default_lock:
        if _default is None or _default_pid != os.getpid():
            _default, _default_pid = Pacer(), os.getpid()
        return _default


def reset_default_pacer() -> None:
    """Forget the process's pacer: its holds, pauses and readings."""
    global _default, _default_pid
    with _default_lock:
        _default, _default_pid = None, None


def _after_fork_in_child() -> None:
    # A child inherits the parent's locks as they were at the fork, perhaps held.
    global _default, _default_pid, _default_lock
    _default, _default_pid, _default_lock = None, None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
