"""What a Meta access token looks like, so a token is checked before it is sealed.

Meta's tokens are opaque, but every one seen is a single run of ASCII
letters and digits (`EAA...`, a few hundred characters). Anything outside
printable ASCII cannot even travel in the `Authorization` header, so it is
refused before sealing instead of failing every sync later. No message
built here holds any character of the token, nor where a bad one sits.

`TOKEN_SHAPED` is what the command line's scrubber redacts from error lines
when a token was pasted where an argument goes; `registry.validate_identifier`
refuses ids of that shape, so the scrubber never hides an id we accept.
"""

from __future__ import annotations

import re

# Meta promises no length; real tokens are ~150-400 characters. The floor
# refuses a truncated paste, the ceiling an accidental file, and keeps the
# header far below the 8 KiB most HTTP servers allow for all headers.
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 4096

# Meta's tokens open with `EAA`; a run of 129 or more letters and digits is
# longer than any id we accept (128 characters), so it cannot be one.
TOKEN_SHAPED = re.compile(r"EAA[A-Za-z0-9]{29,}|[A-Za-z0-9]{129,}")

_PRINTABLE_ASCII = frozenset(chr(code) for code in range(0x21, 0x7F))


def token_problem(token: str) -> str | None:
    """Why `token` cannot be a Meta access token, or None when it can be.

    The reason names counts, never characters or positions.
    """
    if not isinstance(token, str) or not token:
        return "the token is empty"
    if any(char.isspace() or (char.isascii() and not char.isprintable()) for char in token):
        return "the token has spaces, line breaks or control characters inside it"
    if not set(token) <= _PRINTABLE_ASCII:
        return (
            "the token has characters outside printable ASCII; Meta access tokens are"
            " letters and digits only: copy it again from Meta"
        )
    if not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_CHARS:
        return (
            f"the token is {len(token)} characters long; Meta access tokens are"
            f" {MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS}"
        )
    return None
