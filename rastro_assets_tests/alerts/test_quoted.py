"""Data in a notice stays data: one inline code span, and Slack's markup escaped on the wire."""

from __future__ import annotations

from rastro_assets.alerts.channels import Message, WebhookChannel
from rastro_assets.alerts.quoted import for_webhook, quoted
from rastro_assets_tests.alerts.receivers import webhook_receiver


def test_quoted_data_cannot_leave_its_span_or_start_a_line():
    assert quoted("(#190) token `expired`\n*What to do:* relink") == (
        "`(#190) token \u02cbexpired\u02cb *What to do:* relink`"
    )
    # Line and paragraph separators, a right-to-left override, a zero-width space, a tab.
    assert quoted("a\u2028b\u2029c\u202ed\u200be\tf\r\ng") == "`a b c d e f g`"
    assert quoted("") == quoted(" \n ") == "(empty)"
    assert quoted("x" * 500) == "`" + "x" * 299 + "…`"
    assert quoted(12) == "`12`"


def test_slack_s_control_characters_are_escaped_in_all_of_a_webhook_s_text():
    assert for_webhook("a & b <!here> <https://x|y>") == (
        "a &amp; b &lt;!here&gt; &lt;https://x|y&gt;"
    )


def test_a_notice_that_forgot_to_quote_still_pings_no_one():
    message = Message(
        incident_key="snapshot",
        event="opened",
        subject="[rastro] OPEN: <!channel>",
        text="OPEN: <!channel> see <https://evil.example|here> & more",
    )
    with webhook_receiver() as hook:
        WebhookChannel(hook.url).send(message)
    [body] = hook.bodies
    assert body["text"] == "OPEN: &lt;!channel&gt; see &lt;https://evil.example|here&gt; &amp; more"
    assert body["rastro_subject"] == "[rastro] OPEN: &lt;!channel&gt;"
