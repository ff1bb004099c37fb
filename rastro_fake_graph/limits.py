"""Rate limits (fake Graph): Meta's, as the fake keeps them: the model chosen, what was spent.

The model follows the facts page (`meta-graph-api.md`, "Rate limits: what each one
counts, and what binds"); each limit can be switched off (`LimitModel.off`):

- `ads_insights` and `ads_management`, the account's business-use-case buckets, over a
  rolling hour. Insights calls (sync reads, async report runs, their polls and result
  pages) spend `ads_insights`, allowing 190,000 + 400 x active ads at Standard tier and
  600 + 400 x active ads - 0.001 x user errors at Development tier. The account node, its
  ads and `?ids=` (every id counts, each to its own account) spend `ads_management`:
  100,000 + 40 x active ads at Standard, 300 + 40 x active ads at Development. Each bucket
  counts calls, and time: a call's time is its load (below), so an account whose pages are
  large spends its time share before its calls. Reported in `X-Business-Use-Case-Usage`
  under the account's business id (percentages, `estimated_time_to_regain_access` in
  minutes once over, when the window will have freed enough); over, 80000 (insights) or
  80004 (management), subcode 2446079.
- `ad_account_score`: a read costs 1 point, a write 3 (a POST of an async report is a
  write); points decay 300 s after they were spent. A call that would pass the maximum
  (9,000 at Standard, 60 at Development) is refused and blocks the account for 60 s at
  Standard (17 / 2446079) or 300 s at Development (613 / 1487742); the block forgives the
  points. Reported in `X-Ad-Account-Usage` (`reset_time_duration` in seconds: the block's
  rest, or when the points spent have all decayed).
- the insights load, per second, of the app (every token together) and of each account:
  an insights call weighs 1 plus one unit per `ROW_FIELDS_PER_LOAD_UNIT` row-fields it
  returns. Meta publishes no capacity; the defaults are far above what a test world asks,
  and a benchmark sets one that binds. At 100 % the next insights call is refused: 4 /
  1504022 (the app's), 4 / 1504039 (the account's); a second later it has passed.
  Reported in `X-FB-Ads-Insights-Throttle`, on insights answers only.
- `app_platform`, the platform's app-wide calls (`/me`, `/me/adaccounts`, a business's
  account listings): 200 x daily active users an hour, reported in `X-App-Usage` on those
  calls only (the Marketing API is excluded from it); over, code 4 without a subcode.

Errors count as calls: a refused call spends the buckets too. Every window runs on the
world's monotonic seconds (`FakeWorld.monotonic`), so a world whose calendar clock is pinned
still sees them roll, and a test moves them by moving that source (one that moves the
calendar clock by hand can tie both: `world.monotonic = lambda: world.clock().timestamp()`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

TIERS = ("standard", "development")
ACCESS_TIERS = {"standard": "standard_access", "development": "development_access"}
LIMIT_NAMES = (
    "ads_insights",
    "ads_management",
    "ad_account_score",
    "app_insights_load",
    "account_insights_load",
    "app_platform",
)
# The kinds of Graph call, by the limits they spend.
INSIGHTS = "insights"
MANAGEMENT = "management"
PLATFORM = "platform"

HOUR_SECONDS = 3600.0
SCORE_DECAY_SECONDS = 300.0
LOAD_WINDOW_SECONDS = 1.0
READ_POINTS = 1
WRITE_POINTS = 3
ROW_FIELDS_PER_LOAD_UNIT = 100
PLATFORM_CALLS_PER_USER = 200
# Meta publishes none of these three: high enough that no test world's reads come near.
DEFAULT_APP_INSIGHTS_LOAD = 100_000.0
DEFAULT_ACCOUNT_INSIGHTS_LOAD = 20_000.0
DEFAULT_DAILY_ACTIVE_USERS = 1_000

ACCOUNT_THROTTLE_MESSAGE = (
    "There have been too many calls from this ad-account. Wait a bit and try again."
)
APP_LIMIT_MESSAGE = "(#4) Application request limit reached"
USER_LIMIT_MESSAGE = "(#17) User request limit reached"
APP_LOAD_USER_MESSAGE = (
    "There have been too many calls from this app to the ads insights API. Wait a bit and "
    "try again."
)


@dataclass(frozen=True, slots=True)
class Tier:
    """One access tier's numbers, as the facts page's table gives them."""

    insights_base: int
    insights_per_active_ad: int
    insights_per_user_error: float
    management_base: int
    management_per_active_ad: int
    score_max: int
    score_block_seconds: int
    score_code: int
    score_subcode: int


TIER_NUMBERS = {
    "standard": Tier(190_000, 400, 0.0, 100_000, 40, 9_000, 60, 17, 2446079),
    "development": Tier(600, 400, 0.001, 300, 40, 60, 300, 613, 1487742),
}


@dataclass(frozen=True, slots=True)
class LimitModel:
    """Which of Meta's limits the fake enforces, and at what size.

    Args:
        tier: "standard" (Meta's "Full access") or "development" ("Limited access").
        app_insights_load: the app's insights load units a second, every token together.
        account_insights_load: one account's insights load units a second.
        daily_active_users: the app's users; the platform allows 200 calls an hour each.
        off: names from `LIMIT_NAMES` not enforced (their headers still report usage).
    """

    tier: str = "standard"
    app_insights_load: float = DEFAULT_APP_INSIGHTS_LOAD
    account_insights_load: float = DEFAULT_ACCOUNT_INSIGHTS_LOAD
    daily_active_users: int = DEFAULT_DAILY_ACTIVE_USERS
    off: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"tier must be one of {TIERS}, not {self.tier!r}")
        if not (self.app_insights_load > 0 and self.account_insights_load > 0):
            raise ValueError("insights load capacities must be above zero")
        if self.daily_active_users < 1:
            raise ValueError("daily_active_users must be at least 1")
        unknown = set(self.off) - set(LIMIT_NAMES)
        if unknown:
            raise ValueError(f"unknown limits {sorted(unknown)}; known: {LIMIT_NAMES}")
        object.__setattr__(self, "off", frozenset(self.off))

    @property
    def numbers(self) -> Tier:
        return TIER_NUMBERS[self.tier]

    @property
    def access_tier(self) -> str:
        return ACCESS_TIERS[self.tier]

    @property
    def platform_calls_per_hour(self) -> int:
        return PLATFORM_CALLS_PER_USER * self.daily_active_users

    def enforces(self, name: str) -> bool:
        return name not in self.off

    def insights_calls(self, active_ads: int, user_errors: float = 0.0) -> float:
        """The account's `ads_insights` calls an hour."""
        tier = self.numbers
        return (tier.insights_base + tier.insights_per_active_ad * active_ads
                - tier.insights_per_user_error * user_errors)

    def management_calls(self, active_ads: int) -> int:
        """The account's `ads_management` calls an hour."""
        tier = self.numbers
        return tier.management_base + tier.management_per_active_ad * active_ads

    def describe(self) -> str:
        """The model on one line, for a benchmark's header."""
        tier = self.numbers
        parts = [
            f"{self.tier} tier",
            f"ads_insights {tier.insights_base:,} + {tier.insights_per_active_ad} x active ads"
            " an hour",
            f"ads_management {tier.management_base:,} + {tier.management_per_active_ad}"
            " x active ads an hour",
            f"score {tier.score_max:,} per {SCORE_DECAY_SECONDS:.0f} s"
            f" (block {tier.score_block_seconds} s)",
            f"insights load {self.app_insights_load:,.0f}/s app, "
            f"{self.account_insights_load:,.0f}/s account",
            f"platform {self.platform_calls_per_hour:,} calls an hour",
        ]
        if self.off:
            parts.append("off: " + ", ".join(sorted(self.off)))
        return "; ".join(parts)


def load_units(row_fields: int) -> float:
    """What one call weighs in the insights load and in a bucket's time share."""
    return 1.0 + row_fields / ROW_FIELDS_PER_LOAD_UNIT


class RollingWindow:
    """Weights spent at monotonic instants, each gone `seconds` after it was spent."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._spent: deque[tuple[float, float]] = deque()
        self._total = 0.0

    def add(self, now: float, weight: float = 1.0) -> None:
        self._spent.append((now, weight))
        self._total += weight

    def clear(self) -> None:
        self._spent.clear()
        self._total = 0.0

    def total(self, now: float) -> float:
        while self._spent and self._spent[0][0] + self.seconds <= now:
            self._total -= self._spent.popleft()[1]
        if not self._spent:
            self._total = 0.0
        return self._total

    def seconds_until_below(self, capacity: float, now: float) -> float:
        """How long until what is left in the window is below `capacity` (0: it is)."""
        remaining = self.total(now)
        if remaining < capacity:
            return 0.0
        for instant, weight in self._spent:
            remaining -= weight
            if remaining < capacity:
                return instant + self.seconds - now
        return self.seconds

    def seconds_until_empty(self, now: float) -> float:
        self.total(now)
        return self._spent[-1][0] + self.seconds - now if self._spent else 0.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """A limit refused a call: the error Meta answers."""

    limit: str
    code: int
    subcode: int | None
    message: str
    user_title: str | None = None
    user_msg: str | None = None


class AccountSpend:
    """What one ad account has spent of its own limits."""

    def __init__(self) -> None:
        self.calls = {INSIGHTS: RollingWindow(HOUR_SECONDS),
                      MANAGEMENT: RollingWindow(HOUR_SECONDS)}
        self.time = {INSIGHTS: RollingWindow(HOUR_SECONDS),
                     MANAGEMENT: RollingWindow(HOUR_SECONDS)}
        self.user_errors = RollingWindow(HOUR_SECONDS)
        self.score = RollingWindow(SCORE_DECAY_SECONDS)
        self.blocked_until: float | None = None
        self.load = RollingWindow(LOAD_WINDOW_SECONDS)


@dataclass(frozen=True, slots=True)
class BucketUsage:
    """One business-use-case bucket's shares, in percent, and the wait once over."""

    call_count: float
    total_time: float
    regain_seconds: float

    @property
    def over(self) -> bool:
        return max(self.call_count, self.total_time) >= 100.0


class LimitLedger:
    """Everything spent against Meta's limits: per account, per app. Not thread-safe: the
    world's lock guards it."""

    def __init__(self) -> None:
        self.accounts: dict[str, AccountSpend] = {}
        self.app_load = RollingWindow(LOAD_WINDOW_SECONDS)
        self.platform_calls = RollingWindow(HOUR_SECONDS)

    def account(self, ad_account_id: str) -> AccountSpend:
        spend = self.accounts.get(ad_account_id)
        if spend is None:
            spend = self.accounts[ad_account_id] = AccountSpend()
        return spend

    # -- shares -------------------------------------------------------------------------

    def bucket(self, model: LimitModel, ad_account_id: str, kind: str, active_ads: int,
               now: float) -> BucketUsage:
        spend = self.account(ad_account_id)
        if kind == INSIGHTS:
            allowed = model.insights_calls(active_ads, spend.user_errors.total(now))
        else:
            allowed = float(model.management_calls(active_ads))
        allowed = max(allowed, 1.0)
        calls, time = spend.calls[kind], spend.time[kind]
        regain = max(calls.seconds_until_below(allowed, now),
                     time.seconds_until_below(allowed, now))
        return BucketUsage(100.0 * calls.total(now) / allowed,
                           100.0 * time.total(now) / allowed, regain)

    def score_pct(self, model: LimitModel, ad_account_id: str, now: float) -> float:
        spend = self.account(ad_account_id)
        if self.blocked(ad_account_id, now):
            return 100.0
        return 100.0 * spend.score.total(now) / model.numbers.score_max

    def score_reset_seconds(self, ad_account_id: str, now: float) -> float:
        spend = self.account(ad_account_id)
        if self.blocked(ad_account_id, now):
            assert spend.blocked_until is not None
            return spend.blocked_until - now
        return spend.score.seconds_until_empty(now)

    def blocked(self, ad_account_id: str, now: float) -> bool:
        until = self.account(ad_account_id).blocked_until
        return until is not None and now < until

    def app_load_pct(self, model: LimitModel, now: float) -> float:
        return 100.0 * self.app_load.total(now) / model.app_insights_load

    def account_load_pct(self, model: LimitModel, ad_account_id: str, now: float) -> float:
        return 100.0 * self.account(ad_account_id).load.total(now) / model.account_insights_load

    def platform_pct(self, model: LimitModel, now: float) -> float:
        return 100.0 * self.platform_calls.total(now) / model.platform_calls_per_hour

    # -- refusing and spending ---------------------------------------------------------------

    def refusal(self, model: LimitModel, kind: str, now: float, *,
                account: str | None = None, write: bool = False,
                buckets: Iterable[tuple[str, int]] = ()) -> Refusal | None:
        """The limit that refuses this call, if one does; spends the account's score.

        `account` is the account the call is about (its score and load), `buckets` each
        account whose business-use-case bucket the call spends, with its active ads.
        """
        if kind == PLATFORM:
            if (model.enforces("app_platform")
                    and self.platform_pct(model, now) >= 100.0):
                return Refusal("app_platform", 4, None, APP_LIMIT_MESSAGE)
            return None
        if account is not None:
            refused = self._score(model, account, now, write)
            if refused:
                return refused
        name = "ads_insights" if kind == INSIGHTS else "ads_management"
        if model.enforces(name):
            for act, active_ads in buckets:
                if self.bucket(model, act, kind, active_ads, now).over:
                    code = 80000 if kind == INSIGHTS else 80004
                    return Refusal(name, code, 2446079, ACCOUNT_THROTTLE_MESSAGE)
        if kind != INSIGHTS or account is None:
            return None
        if model.enforces("app_insights_load") and self.app_load_pct(model, now) >= 100.0:
            return Refusal("app_insights_load", 4, 1504022, APP_LIMIT_MESSAGE,
                           "Too many API requests", APP_LOAD_USER_MESSAGE)
        if (model.enforces("account_insights_load")
                and self.account_load_pct(model, account, now) >= 100.0):
            return Refusal("account_insights_load", 4, 1504039, APP_LIMIT_MESSAGE,
                           "Too many API requests", ACCOUNT_THROTTLE_MESSAGE)
        return None

    def _score(self, model: LimitModel, account: str, now: float, write: bool) -> Refusal | None:
        tier = model.numbers
        spend = self.account(account)
        refused = Refusal(
            "ad_account_score", tier.score_code, tier.score_subcode,
            USER_LIMIT_MESSAGE if tier.score_code == 17 else ACCOUNT_THROTTLE_MESSAGE,
        )
        if self.blocked(account, now) and model.enforces("ad_account_score"):
            return refused
        points = WRITE_POINTS if write else READ_POINTS
        if (model.enforces("ad_account_score")
                and spend.score.total(now) + points > tier.score_max):
            spend.blocked_until = now + tier.score_block_seconds
            spend.score.clear()
            return refused
        spend.score.add(now, points)
        return None

    def spend(self, kind: str, now: float, *, account: str | None = None,
              buckets: Iterable[tuple[str, int]] = (), weight: float = 1.0,
              user_error: bool = False) -> None:
        """Count one answered call: `buckets` are (account, calls) its ids spend."""
        if kind == PLATFORM:
            self.platform_calls.add(now)
            return
        for act, calls in buckets:
            spend = self.account(act)
            spend.calls[kind].add(now, calls)
            spend.time[kind].add(now, weight + calls - 1 if act == account else calls)
        if account is None:
            return
        if user_error:
            self.account(account).user_errors.add(now)
        if kind == INSIGHTS:
            self.app_load.add(now, weight)
            self.account(account).load.add(now, weight)

    def use(self, ad_account_id: str, kind: str, calls: int, now: float) -> None:
        """Spend `calls` of the account's `kind` bucket at once, as calls made elsewhere."""
        spend = self.account(ad_account_id)
        spend.calls[kind].add(now, calls)
        spend.time[kind].add(now, calls)


def regain_minutes(seconds: float) -> int:
    return math.ceil(seconds / 60) if seconds > 0 else 0
