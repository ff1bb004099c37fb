"""Trouble (fake Graph): staged by hand in a served world, as a demo rehearses a bad day, and gone.

Each kind is what Meta does on such a day (the facts page's answers):
- `dead-token`: the demo token dies, 190 / 463 "Session has expired" on every call;
- `throttle ACCOUNT`: the account is over its own `ads_insights` limit, 80000 / 2446079 on
  each insights call with `estimated_time_to_regain_access`, every try, until taken away;
- `slow`: Meta is overloaded: every Graph answer comes `SLOW_ANSWER_SECONDS` late and says
  "Please retry your request later" (code 2, `is_transient`), so a read gives up after its
  retries, within tens of seconds, rather than waiting minutes on a timeout per request;
- `lost-permission ACCOUNT`: the token no longer reaches the account: (#200) on its reads,
  and `/me/adaccounts` leaves it out.

Taking a kind away restores what staging changed, and only that.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from rastro_fake_graph.world import DEMO_TOKEN, FakeWorld, normalize_account

DEAD_TOKEN = "dead-token"
THROTTLE = "throttle"
SLOW = "slow"
LOST_PERMISSION = "lost-permission"
KINDS = (DEAD_TOKEN, THROTTLE, SLOW, LOST_PERMISSION)
ACCOUNT_KINDS = frozenset({THROTTLE, LOST_PERMISSION})
DEAD_TOKEN_SUBCODE = 463
THROTTLE_REGAIN_MINUTES = 10
"""Meta's regain time for a staged throttle: past what a run waits out in place (the Meta
client's `ACCOUNT_WAIT_IN_RUN_SECONDS`), so the sync ends throttled and the account is held."""
SLOW_ANSWER_SECONDS = 5.0
USAGE = "dead-token, throttle ACCOUNT, slow, lost-permission ACCOUNT"


@dataclass(frozen=True, order=True)
class Staged:
    """One trouble staged: its kind, and the account it is about (None: every account)."""

    kind: str
    account: str | None = None

    def to_json(self) -> dict[str, str | None]:
        return {"kind": self.kind, "account": self.account}


class TroubleDesk:
    """Stages and takes away trouble in `world` for `token` (the demo's); thread-safe."""

    def __init__(self, world: FakeWorld, token: str = DEMO_TOKEN) -> None:
        self.world = world
        self.token = token
        self._staged: set[Staged] = set()
        self._delay_before = world.request_delay_seconds
        self._lock = threading.Lock()

    def staged(self) -> list[Staged]:
        with self._lock:
            return sorted(self._staged, key=_order)

    def stage(self, kind: str, account: str | None = None) -> Staged:
        """Stage `kind` (about `account` for the account kinds); ValueError for bad input,
        with nothing changed. Staging what is staged already changes nothing."""
        trouble = self._checked(kind, account)
        with self._lock:
            if trouble not in self._staged:
                self._apply(trouble)
                self._staged.add(trouble)
        return trouble

    def mend(self, kind: str | None = None, account: str | None = None) -> list[Staged]:
        """Take away the staged trouble of `kind` (every kind when None; of `account` only,
        when given); what was taken away."""
        if kind is not None and kind not in KINDS:
            raise ValueError(f"no trouble kind {kind!r}: one of {USAGE}")
        wanted = None if account is None else normalize_account(account)
        with self._lock:
            mended = [
                trouble
                for trouble in sorted(self._staged, key=_order)
                if kind in (None, trouble.kind) and wanted in (None, trouble.account)
            ]
            for trouble in mended:
                self._undo(trouble)
                self._staged.discard(trouble)
        return mended

    def _checked(self, kind: str, account: str | None) -> Staged:
        if kind not in KINDS:
            raise ValueError(f"no trouble kind {kind!r}: one of {USAGE}")
        if kind not in ACCOUNT_KINDS:
            if account is not None:
                raise ValueError(f"{kind} is about every account: it takes no ACCOUNT")
            return Staged(kind)
        if not account:
            raise ValueError(f"{kind} needs the ad account it is about: {kind} ACCOUNT")
        act = normalize_account(account)
        if act not in self.world.accounts:
            raise ValueError(f"the demo's fake Graph has no ad account {act}")
        reached = {each.ad_account_id for each in self.world.reachable(self.token)}
        lost = Staged(LOST_PERMISSION, act) in self._staged
        if act not in reached and not lost:
            raise ValueError(f"the demo token does not reach {act}")
        return Staged(kind, act)

    def _apply(self, trouble: Staged) -> None:
        world, act = self.world, trouble.account
        if trouble.kind == DEAD_TOKEN:
            world.kill_token(self.token, DEAD_TOKEN_SUBCODE)
        elif trouble.kind == THROTTLE:
            assert act is not None
            world.throttle_account(act, THROTTLE_REGAIN_MINUTES)
        elif trouble.kind == SLOW:
            with world.lock:
                self._delay_before = world.request_delay_seconds
                world.request_delay_seconds = max(self._delay_before, SLOW_ANSWER_SECONDS)
                world.overloaded = True
        else:
            assert act is not None
            world.revoke(self.token, act)

    def _undo(self, trouble: Staged) -> None:
        world, act = self.world, trouble.account
        if trouble.kind == DEAD_TOKEN:
            world.revive_token(self.token)
        elif trouble.kind == THROTTLE:
            assert act is not None
            world.end_throttle(act)
        elif trouble.kind == SLOW:
            with world.lock:
                world.request_delay_seconds = self._delay_before
                world.overloaded = False
        else:
            assert act is not None
            world.grant(self.token, act)


def _order(trouble: Staged) -> tuple[int, str]:
    return KINDS.index(trouble.kind), trouble.account or ""
