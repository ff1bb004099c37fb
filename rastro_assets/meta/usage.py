"""Meta's rate-limit headers, read into one `Usage`.

Any response may carry any of the four headers, error responses included,
so every response is read. A header whose JSON cannot be read is ignored:
usage is advice for pacing, and a garbled header must never fail a sync.

`regain_seconds` is the longest wait Meta announces:
- `estimated_time_to_regain_access` (minutes, in `X-Business-Use-Case-Usage`)
  always counts when above zero;
- `reset_time_duration` (seconds, in `X-Ad-Account-Usage`) is when the
  account's rolling window resets, which is advice only while the account is
  still under its limit. It counts as a time to regain access only once
  `acc_id_util_pct` has reached 100, or when the response is a throttling
  error (`throttled=True`), since then it is the best wait Meta gave.

The account's own share (`account_pct`, and the `limit` it belongs to) is the highest of
its business use cases (each entry's calls, CPU time and total time, its `type` naming the
limit), its ad account score (`X-Ad-Account-Usage`) and its own insights load
(`acc_id_util_pct` of `X-FB-Ads-Insights-Throttle`). The app's share (`app_pct`), every
token together, is the insights throttle's `app_id_util_pct` and `X-App-Usage`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from rastro_assets.meta.limits import RateLimit
from rastro_assets.meta.models import Usage

BUSINESS_USE_CASE_HEADER = "X-Business-Use-Case-Usage"
AD_ACCOUNT_HEADER = "X-Ad-Account-Usage"
APP_HEADER = "X-App-Usage"
INSIGHTS_THROTTLE_HEADER = "X-FB-Ads-Insights-Throttle"
USAGE_HEADERS = (
    BUSINESS_USE_CASE_HEADER,
    AD_ACCOUNT_HEADER,
    APP_HEADER,
    INSIGHTS_THROTTLE_HEADER,
)

PERCENT_KEYS = frozenset(
    {"call_count", "total_cputime", "total_time", "acc_id_util_pct", "app_id_util_pct"}
)
REGAIN_MINUTES_KEY = "estimated_time_to_regain_access"
RESET_SECONDS_KEY = "reset_time_duration"
ACCOUNT_PCT_KEY = "acc_id_util_pct"
APP_PCT_KEY = "app_id_util_pct"
SHARE_KEYS = ("call_count", "total_cputime", "total_time")
BUSINESS_USE_CASE_TYPE_KEY = "type"
FULL_PCT = 100.0


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _objects(value: Any) -> Iterable[Mapping[str, Any]]:
    """Every JSON object inside `value`, however Meta nested it."""
    if isinstance(value, Mapping):
        yield value
        for inner in value.values():
            yield from _objects(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _objects(inner)


def _header(headers: Mapping[str, str], name: str) -> Any:
    raw = headers.get(name)
    if raw is None:
        lowered = name.lower()
        raw = next((v for k, v in headers.items() if k.lower() == lowered), None)
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, TypeError):
        return None


class _Shares:
    """The highest account share seen so far (and its limit), and the app's."""

    def __init__(self) -> None:
        self.account_pct = 0.0
        self.limit: str | None = None
        self.app_pct = 0.0

    def account(self, pct: float | None, limit: str) -> None:
        if pct is not None and (self.limit is None or pct > self.account_pct):
            self.account_pct, self.limit = pct, limit

    def app(self, pct: float | None) -> None:
        if pct is not None:
            self.app_pct = max(self.app_pct, pct)


def _business_use_case_limit(entry: Mapping[str, Any]) -> str:
    """The limit a business-use-case entry counts: its `type` when the product names it.

    The Marketing API's other types (catalogs, pages...) are management calls of the account.
    """
    kind = entry.get(BUSINESS_USE_CASE_TYPE_KEY)
    if kind == RateLimit.ADS_INSIGHTS:
        return RateLimit.ADS_INSIGHTS
    return RateLimit.ADS_MANAGEMENT


def _shares(decoded: Mapping[str, Any]) -> _Shares:
    shares = _Shares()
    for entry in _objects(decoded[BUSINESS_USE_CASE_HEADER]):
        limit = _business_use_case_limit(entry)
        for key in SHARE_KEYS:
            shares.account(_number(entry.get(key)), limit)
    for obj in _objects(decoded[AD_ACCOUNT_HEADER]):
        shares.account(_number(obj.get(ACCOUNT_PCT_KEY)), RateLimit.AD_ACCOUNT_SCORE)
    for obj in _objects(decoded[INSIGHTS_THROTTLE_HEADER]):
        shares.account(_number(obj.get(ACCOUNT_PCT_KEY)), RateLimit.ACCOUNT_INSIGHTS_LOAD)
        shares.app(_number(obj.get(APP_PCT_KEY)))
    for obj in _objects(decoded[APP_HEADER]):
        for key in SHARE_KEYS:
            shares.app(_number(obj.get(key)))
    return shares


def decode_usage_headers(headers: Mapping[str, str]) -> dict[str, Any]:
    """Each usage header's JSON, decoded once for everything read from one answer (None: the
    header is absent or unreadable)."""
    return {name: _header(headers, name) for name in USAGE_HEADERS}


def app_readings(headers: Mapping[str, str]) -> tuple[float | None, float | None]:
    """`app_readings_of` the answer's headers."""
    return app_readings_of(decode_usage_headers(headers))


def app_readings_of(decoded: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """The app's shares an answer says, each None when it says nothing of it: its insights
    load (`app_id_util_pct`, which binds every Marketing API call) and its platform calls
    (`X-App-Usage`, which binds only platform calls such as `/me`)."""
    insights: float | None = None
    for obj in _objects(decoded[INSIGHTS_THROTTLE_HEADER]):
        pct = _number(obj.get(APP_PCT_KEY))
        if pct is not None:
            insights = max(insights or 0.0, pct)
    platform: float | None = None
    for obj in _objects(decoded[APP_HEADER]):
        for key in SHARE_KEYS:
            pct = _number(obj.get(key))
            if pct is not None:
                platform = max(platform or 0.0, pct)
    return insights, platform


def parse_usage(headers: Mapping[str, str], *, throttled: bool = False) -> Usage:
    """The usage one response announces.

    Args:
        headers: the response headers (any mapping; names case-insensitive).
        throttled: the response is a throttling error, so the account-window
            reset counts as a time to regain access even below 100%.
    """
    return usage_of(decode_usage_headers(headers), throttled=throttled)


def usage_of(decoded: Mapping[str, Any], *, throttled: bool = False) -> Usage:
    """`parse_usage` of headers already decoded (`decode_usage_headers`)."""
    pct = 0.0
    regain = 0.0
    reset_seconds: float | None = None
    for name in USAGE_HEADERS:
        for obj in _objects(decoded[name]):
            for key, value in obj.items():
                number = _number(value)
                if number is None:
                    continue
                if key in PERCENT_KEYS:
                    pct = max(pct, number)
                elif key == REGAIN_MINUTES_KEY:
                    regain = max(regain, number * 60)
            if name == AD_ACCOUNT_HEADER:
                reset = _number(obj.get(RESET_SECONDS_KEY))
                if reset is not None:
                    reset_seconds = max(reset_seconds or 0.0, reset)
                account_pct = _number(obj.get(ACCOUNT_PCT_KEY)) or 0.0
                if reset and (throttled or account_pct >= FULL_PCT):
                    regain = max(regain, reset)
    shares = _shares(decoded)
    return Usage(
        pct=pct,
        regain_seconds=math.ceil(regain) if regain > 0 else None,
        account_pct=shares.account_pct,
        app_pct=shares.app_pct,
        limit=shares.limit,
        reset_seconds=math.ceil(reset_seconds) if reset_seconds else None,
    )
