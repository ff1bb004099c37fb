"""What the registry accepts as names: site and connection ids, site names, currencies, zones.

Each check returns the value as stored, or raises ValueError with a message fit for the
command line (one line, the offending text shown escaped and cut short).
"""

from __future__ import annotations

import re
import unicodedata

from rastro_assets.timekeeping import zone
from rastro_assets.tokens import TOKEN_SHAPED

MAX_IDENTIFIER_CHARS = 128
MAX_NAME_CHARS = 200

_CURRENCY = re.compile(r"[A-Z]{3}")
_IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]*")
# Cc controls, Cs lone surrogates, Zl/Zp line and paragraph separators.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
# Embeddings, overrides and isolates: they reorder how the text around them reads.
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def normalize_currency(raw: str) -> str:
    """An ISO 4217-shaped code, upper-cased: three letters A-Z; ValueError otherwise."""
    text = raw.strip().upper() if isinstance(raw, str) else ""
    if not _CURRENCY.fullmatch(text):
        raise ValueError(f"currency {raw!r} is not a three-letter ISO code such as USD or BRL")
    return text


def validate_timezone(raw: str) -> str:
    """An IANA timezone name known to zoneinfo; ValueError otherwise."""
    text = raw.strip() if isinstance(raw, str) else ""
    if not text:
        raise ValueError("timezone is empty: give an IANA name such as America/Sao_Paulo")
    try:
        zone(text)
    except ValueError:
        raise ValueError(
            f"timezone {raw!r} is not an IANA timezone name such as America/Sao_Paulo"
        ) from None
    return text


def validate_identifier(kind: str, raw: str) -> str:
    """A site or connection id: letters, digits and `_ . : @ -`, starting alphanumeric.

    Never shaped like a Meta token, so the command line's scrubber, which
    redacts token-shaped text from error lines, never hides an id.
    """
    text = raw.strip() if isinstance(raw, str) else ""
    if not _IDENTIFIER.fullmatch(text) or len(text) > MAX_IDENTIFIER_CHARS:
        raise ValueError(
            f"{kind} {_shown(raw)} is not a valid id: use up to {MAX_IDENTIFIER_CHARS} letters,"
            " digits and _ . : @ -, starting with a letter or digit"
        )
    if TOKEN_SHAPED.search(text):
        raise ValueError(f"{kind} {_shown(raw)} looks like a Meta access token, not an id")
    return text


def validate_site_name(raw: str) -> str:
    """A site's human name, stripped: at most `MAX_NAME_CHARS`, no control characters.

    Control, line-separator and bidirectional-override characters would break
    the one-line output of every command and table that shows the name, or
    make it read as another; emoji and every script are welcome.
    """
    text = raw.strip() if isinstance(raw, str) else ""
    if not text:
        raise ValueError("site name is empty: leave --name out to keep the current one")
    if len(text) > MAX_NAME_CHARS:
        raise ValueError(f"site name is {len(text)} characters long; at most {MAX_NAME_CHARS}")
    if any(unicodedata.category(char) in _REFUSED_CATEGORIES or char in _BIDI for char in text):
        raise ValueError(
            f"site name {_shown(raw)} has control, line-break or bidirectional-override"
            " characters; use plain text"
        )
    return text


def _shown(raw: object, limit: int = 60) -> str:
    """`raw` as its repr (control characters escaped), cut short so the error stays a line."""
    shown = repr(raw)
    return shown if len(shown) <= limit else f"{shown[: limit - 4]}...{shown[-1]}"
