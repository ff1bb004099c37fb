"""Errors (Meta layer): Meta's failures, classified as the facts page's table says.

No message built here ever contains a token: the token travels in a header
and is never passed to this module (the client passes `classify_error` a
`scrub` that removes it, in case Meta echoes it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

from rastro_assets.meta.limits import RateLimit
from rastro_assets.meta.values import int_or_none, text

TOKEN_CODES = frozenset({190})
THROTTLE_CODES = frozenset({4, 17, 32, 613, *range(80000, 80015)})
PERMISSION_CODES = frozenset({10, *range(200, 300)})
TOO_MUCH_DATA_SUBCODES = frozenset({(100, 1504018), (2, 1504038)})
TOO_MUCH_DATA_MESSAGE = "reduce the amount of data"
TRANSIENT_CODES = frozenset({1, 2})
# Which limit a throttle names, from the facts page's table of limits.
ADS_INSIGHTS_THROTTLE_CODE = 80000
BUSINESS_USE_CASE_CODES = range(80000, 80015)
APP_INSIGHTS_LOAD_SUBCODE = 1504022
ACCOUNT_INSIGHTS_LOAD_SUBCODE = 1504039
APPLICATION_LIMIT_CODE = 4
ACCOUNT_SCORE_CODE = 17
ACCOUNT_RATE_CODE = 613
PAGE_LIMIT_CODE = 32
UNKNOWN_ALIAS_CODE = 803


class ErrorKind(StrEnum):
    TOKEN = "token"
    THROTTLED = "throttled"
    PERMISSION = "permission"
    TOO_MUCH_DATA = "too_much_data"
    TRANSIENT = "transient"
    OTHER = "other"


class MetaError(Exception):
    """A Meta request failed. `kind` says what the sync does about it."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        code: int | None = None,
        subcode: int | None = None,
        http_status: int | None = None,
        fbtrace_id: str | None = None,
        regain_seconds: int | None = None,
        limit: str | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.code = code
        self.subcode = subcode
        self.http_status = http_status
        self.fbtrace_id = fbtrace_id
        self.regain_seconds = regain_seconds
        # A throttle's limit (`meta.limits.RateLimit`): whose limit refused, the account's
        # own or the app's.
        self.limit = limit

    def __str__(self) -> str:
        parts = [self.message]
        if self.code is not None:
            parts.append(f"code {self.code}" + (f"/{self.subcode}" if self.subcode else ""))
        if self.http_status is not None:
            parts.append(f"HTTP {self.http_status}")
        if self.fbtrace_id:
            parts.append(f"fbtrace_id {self.fbtrace_id}")
        return " (".join([parts[0], ", ".join(parts[1:]) + ")"]) if len(parts) > 1 else parts[0]

    def __repr__(self) -> str:
        return f"MetaError({self.kind.value!r}, {str(self)!r})"


class MalformedResponse(MetaError):
    """Meta answered with something that is not the documented shape."""

    def __init__(self, message: str, *, http_status: int | None = None) -> None:
        super().__init__(ErrorKind.TRANSIENT, message, http_status=http_status)


class TimedOut(MetaError):
    """No answer within the timeout: for insights, a sign of too much data."""


def throttle_limit(code: int | None, subcode: int | None) -> str | None:
    """The `RateLimit` a throttle of `code`/`subcode` names; None when `code` is no throttle.

    80000 is the account's `ads_insights` business use case; the other 800xx codes are its
    other business use cases, which the product only meets as management calls.
    """
    if code in BUSINESS_USE_CASE_CODES:
        if code == ADS_INSIGHTS_THROTTLE_CODE:
            return RateLimit.ADS_INSIGHTS
        return RateLimit.ADS_MANAGEMENT
    if code == ACCOUNT_SCORE_CODE:
        return RateLimit.AD_ACCOUNT_SCORE
    if code == ACCOUNT_RATE_CODE:
        # Without a subcode Meta has cut the account's quota; with one it is the score.
        return RateLimit.ABUSE if subcode is None else RateLimit.AD_ACCOUNT_SCORE
    if code == APPLICATION_LIMIT_CODE:
        if subcode == ACCOUNT_INSIGHTS_LOAD_SUBCODE:
            return RateLimit.ACCOUNT_INSIGHTS_LOAD
        if subcode == APP_INSIGHTS_LOAD_SUBCODE:
            return RateLimit.APP_INSIGHTS_LOAD
        return RateLimit.APP_PLATFORM
    if code == PAGE_LIMIT_CODE:
        return RateLimit.APP_PLATFORM
    return None


def classify_error(
    error: Mapping[str, Any],
    *,
    http_status: int | None,
    regain_seconds: int | None,
    scrub: Callable[[str], str] | None = None,
) -> MetaError:
    """The `MetaError` for Meta's `{"error": {...}}` object, per the facts table.

    Args:
        error: the object under `"error"`.
        http_status: the response status.
        regain_seconds: the wait the usage headers announced (kept on
            throttling errors only).
        scrub: a function cleaning text before it enters a message (the
            client passes one that removes its token, in case Meta echoes it).
    """
    code = int_or_none(error.get("code"))
    subcode = int_or_none(error.get("error_subcode"))
    message = text(error.get("message")) or "Meta returned an error without a message"
    user_message = text(error.get("error_user_msg"))
    if user_message and user_message not in message:
        message = f"{message} ({user_message})"
    if scrub is not None:
        message = scrub(message)
    fbtrace = text(error.get("fbtrace_id"))

    if code in TOKEN_CODES:
        kind = ErrorKind.TOKEN
    elif code in THROTTLE_CODES:
        kind = ErrorKind.THROTTLED
    elif code in PERMISSION_CODES:
        kind = ErrorKind.PERMISSION
    elif (code == 1 and TOO_MUCH_DATA_MESSAGE in message.lower()) or (
        (code, subcode) in TOO_MUCH_DATA_SUBCODES
    ):
        kind = ErrorKind.TOO_MUCH_DATA
    elif code in TRANSIENT_CODES or error.get("is_transient") is True:
        kind = ErrorKind.TRANSIENT
    else:
        kind = ErrorKind.OTHER
    return MetaError(
        kind,
        message,
        code=code,
        subcode=subcode,
        http_status=http_status,
        fbtrace_id=fbtrace,
        regain_seconds=regain_seconds if kind is ErrorKind.THROTTLED else None,
        limit=throttle_limit(code, subcode) if kind is ErrorKind.THROTTLED else None,
    )
