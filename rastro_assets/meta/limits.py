"""Rate limits (Meta layer): their names, as the product records which one holds an account.

Each is one row of the facts page's table ("Rate limits: what each one counts, and what
binds"). A name is stored in `meta_sync_runs.rate_limit` and shown by `rastro status`,
`rastro plan`, the health asset and the `rate_limited` incident, so it never changes.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum

from rastro_assets.meta.models import Usage


class RateLimit(StrEnum):
    # The account's own business-use-case buckets (a rolling hour).
    ADS_INSIGHTS = "ads_insights"
    ADS_MANAGEMENT = "ads_management"
    # The account's own score, decaying over five minutes.
    AD_ACCOUNT_SCORE = "ad_account_score"
    # The insights load per second: the account's own share, and the app's (every token).
    ACCOUNT_INSIGHTS_LOAD = "account_insights_load"
    APP_INSIGHTS_LOAD = "app_insights_load"
    # The platform's app-wide hourly calls (`X-App-Usage`): `/me`, listings, never insights.
    APP_PLATFORM = "app_platform"
    # 613 without a subcode: Meta cut the account's quota; a hold of hours.
    ABUSE = "abuse"


ACCOUNT_LIMITS = frozenset(
    {
        RateLimit.ADS_INSIGHTS,
        RateLimit.ADS_MANAGEMENT,
        RateLimit.AD_ACCOUNT_SCORE,
        RateLimit.ACCOUNT_INSIGHTS_LOAD,
        RateLimit.ABUSE,
    }
)
"""The limits that belong to one account: only these hold that account alone."""

DESCRIPTIONS: dict[RateLimit, str] = {
    RateLimit.ADS_INSIGHTS: "its ads_insights business use case (calls an hour)",
    RateLimit.ADS_MANAGEMENT: "its ads_management business use case (calls an hour)",
    RateLimit.AD_ACCOUNT_SCORE: "its ad account score (five minutes)",
    RateLimit.ACCOUNT_INSIGHTS_LOAD: "its own insights load (per second)",
    RateLimit.APP_INSIGHTS_LOAD: "the app's insights load, every token together (per second)",
    RateLimit.APP_PLATFORM: "the app's platform calls an hour",
    RateLimit.ABUSE: "Meta's abuse prevention (613 without a subcode: its quota was cut)",
}
"""A limit as a person reads it, after "held by"."""


def describe(limit: str | None) -> str:
    """`limit` as a person reads it; an unknown name as itself."""
    if limit is None:
        return "Meta's rate limits"
    try:
        return DESCRIPTIONS[RateLimit(limit)]
    except ValueError:
        return limit


ACCOUNT_HOLD_PCT = 90.0
"""The account's own share of its limits from which it is held, not merely slowed."""

MIN_HOLD = timedelta(seconds=60)
"""The shortest hold on an account's own limit: Meta's windows free no sooner."""


def account_hold(usage: Usage) -> timedelta | None:
    """How long `usage` holds its account: max(regain, reset, `MIN_HOLD`) once the account's
    own share reaches `ACCOUNT_HOLD_PCT` or Meta announced a wait to regain access; None
    otherwise. The app's share never holds one account: every token shares it."""
    if usage.account_pct < ACCOUNT_HOLD_PCT and not usage.regain_seconds:
        return None
    seconds = max(usage.regain_seconds or 0, usage.reset_seconds or 0)
    return max(timedelta(seconds=seconds), MIN_HOLD)
