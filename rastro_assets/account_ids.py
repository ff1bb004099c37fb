"""The one rule of an ad account id: `act_<digits>`, also given as bare digits.

The CLI, the registry, the Dagster partitions and the Meta client all take an
account id from outside; each normalizes it here so every table, partition key
and Graph path spells one account one way.
"""

from __future__ import annotations

import re

# Graph object ids, ad accounts' included, are 64-bit numbers: at most 20
# digits (those seen have 15 to 17), so a longer one is a typo or a paste of
# something else. ASCII digits only: `\d` would let other scripts' digits
# through to Meta and DuckDB.
MAX_ACCOUNT_DIGITS = 20
_ACCOUNT_ID = re.compile(rf"(?:act_)?([0-9]{{1,{MAX_ACCOUNT_DIGITS}}})")


def normalize_account_id(raw: str) -> str:
    """`act_<digits>` or bare digits, as `act_<digits>`; ValueError otherwise."""
    text = raw.strip() if isinstance(raw, str) else ""
    match = _ACCOUNT_ID.fullmatch(text)
    if match is None or int(match[1]) >= 2**64:
        shown = repr(raw)
        shown = shown if len(shown) <= 60 else f"{shown[:56]}...{shown[-1]}"
        raise ValueError(
            f"ad account id {shown} is not act_<digits> or bare digits, at most"
            f" {MAX_ACCOUNT_DIGITS} digits (for example act_1234567890)"
        )
    return f"act_{match[1]}"
