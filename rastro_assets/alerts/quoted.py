"""Text that others wrote, as a notice quotes it, and the webhook's escaping of Slack's markup.

A notice is the product's words with data in them: Meta's error messages, a run's failure
(which may quote a partition key anyone can add in the UI), a tick's error, a path from the
environment. Each piece of data goes through `quoted`, which makes it one inline code span:
its control and format characters (line breaks, bidirectional overrides) become spaces, so
it cannot start a line of its own, and its backticks become `ˋ`, so it cannot close its span.
Slack and Teams show an inline code span as it is, no link, no mention, no bold; an email
reads it as a word between backticks, as it reads the commands the product names.

Identifiers the product checked when they were stored (connection, site and account ids,
incident keys) are left as words: they hold none of these characters.

`for_webhook` escapes `&`, `<` and `>` in the whole text, product words included, as Slack
asks of any text it should not read as markup (`<!channel>`, `<https://...|label>`): a
notice that forgot to quote something still pings no one and hides no link.
"""

from __future__ import annotations

import unicodedata

QUOTE_LIMIT = 300
"""Characters of one piece of data a notice quotes: the first line of an error says enough."""
_BACKTICK_STAND_IN = "\u02cb"  # MODIFIER LETTER GRAVE ACCENT: looks like a backtick, is none


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """`value` as data: one inline code span that no character of it can leave."""
    text = "".join(
        " " if unicodedata.category(char).startswith(("C", "Z")) else char for char in str(value)
    )
    text = " ".join(text.split()).replace("`", _BACKTICK_STAND_IN)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return f"`{text}`" if text else "(empty)"


def for_webhook(text: str) -> str:
    """`text` with Slack's three control characters escaped (Slack's "Escaping text")."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
