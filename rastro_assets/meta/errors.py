"""Meta failures, classified as the facts page's table says.

No message built here ever contains a token: the token travels in a header
and is never passed to this module.
"""

from __future__ import annotations

from enum import StrEnum


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
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.code = code
        self.subcode = subcode
        self.http_status = http_status
        self.fbtrace_id = fbtrace_id
        self.regain_seconds = regain_seconds

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
