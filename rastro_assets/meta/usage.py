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
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

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


def parse_usage(headers: Mapping[str, str], *, throttled: bool = False) -> Usage:
    """The usage one response announces.

    Args:
        headers: the response headers (any mapping; names case-insensitive).
        throttled: the response is a throttling error, so the account-window
            reset counts as a time to regain access even below 100%.
    """
    pct = 0.0
    regain = 0.0
    for name in USAGE_HEADERS:
        parsed = _header(headers, name)
        for obj in _objects(parsed):
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
                account_pct = _number(obj.get(ACCOUNT_PCT_KEY)) or 0.0
                if reset and (throttled or account_pct >= FULL_PCT):
                    regain = max(regain, reset)
    return Usage(pct=pct, regain_seconds=math.ceil(regain) if regain > 0 else None)
