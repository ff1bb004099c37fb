"""Trouble staged in a served fake Graph through its control route, as the product's client
reads it, and taken away; the route answers only the holder of the server's key."""

from __future__ import annotations

from datetime import date

import httpx
import pytest

from rastro_assets.meta.client import MetaClient
from rastro_assets.meta.errors import ErrorKind, MetaError
from rastro_fake_graph import DEMO_TOKEN, FakeGraphTransport, FakeWorld, serve
from rastro_fake_graph.server import CONTROL_HEADER
from rastro_fake_graph.trouble import SLOW_ANSWER_SECONDS, THROTTLE_REGAIN_MINUTES

KEY = "k3y-for-the-demos-trouble-0123456789"
DAY = date(2026, 2, 10)


@pytest.fixture
def served():
    world = FakeWorld.demo()
    with serve(world, control_key=KEY) as server:
        yield world, server


def control(server, body=None, key=KEY) -> httpx.Response:
    headers = {CONTROL_HEADER: key} if key is not None else {}
    if body is None:
        return httpx.get(server.control_url, headers=headers)
    return httpx.post(server.control_url, json=body, headers=headers)


def client(base_url: str, **kwargs) -> MetaClient:
    return MetaClient(DEMO_TOKEN, base_url=base_url, max_retries=0, sleep=lambda s: None, **kwargs)


def kind_of(read) -> tuple[ErrorKind, int | None]:
    with pytest.raises(MetaError) as caught:
        read()
    return caught.value.kind, caught.value.regain_seconds


def test_the_control_route_answers_only_the_key(served):
    world, server = served
    assert control(server, key=None).status_code == 403
    assert control(server, key=KEY[:-1] + "x").status_code == 403
    wrong = "wrong-key-of-the-same-size-0123456"
    assert control(server, {"stage": "dead-token"}, key=wrong).status_code == 403
    assert world.token_state(DEMO_TOKEN) == ("ok", None)
    assert control(server).json() == {"staged": []}
    with serve(world) as keyless:
        answer = httpx.post(keyless.control_url, json={"stage": "slow"},
                            headers={CONTROL_HEADER: KEY})
        assert answer.status_code == 404
    assert not world.overloaded


def test_bad_trouble_is_refused_and_changes_nothing(served):
    world, server = served
    for body in (
        {"stage": "flood"},
        {"stage": "throttle"},
        {"stage": "throttle", "account": "act_9999"},
        {"stage": "throttle", "account": "not-an-id"},
        {"stage": "slow", "account": "act_1001"},
        {"mend": "flood"},
        {"what": "slow"},
    ):
        answer = control(server, body)
        assert answer.status_code == 400, body
        assert answer.json()["error"]
    assert control(server).json() == {"staged": []}
    assert world.throttled_for("act_1003") is None and not world.overloaded


def test_each_kind_reads_as_meta_says_it_and_is_taken_away(served):
    world, server = served
    with client(server.base_url) as meta:
        for body in (
            {"stage": "dead-token"},
            {"stage": "throttle", "account": "act_1003"},
            {"stage": "lost-permission", "account": "1002"},
        ):
            assert control(server, body).status_code == 200
        assert control(server).json() == {"staged": [
            {"kind": "dead-token", "account": None},
            {"kind": "throttle", "account": "act_1003"},
            {"kind": "lost-permission", "account": "act_1002"},
        ]}
        assert kind_of(lambda: meta.account("act_1001")) == (ErrorKind.TOKEN, None)

        mended = control(server, {"mend": "dead-token"}).json()
        assert mended["changed"] == [{"kind": "dead-token", "account": None}]
        assert meta.account("act_1001").currency == "BRL"
        # Over its own insights limit: its insights refused with Meta's regain time, its
        # catalog still read.
        throttled = kind_of(lambda: list(meta.insights("act_1003", DAY, DAY)))
        assert throttled == (ErrorKind.THROTTLED, THROTTLE_REGAIN_MINUTES * 60)
        assert meta.account("act_1003").currency == "USD"
        assert kind_of(lambda: meta.account("act_1002"))[0] is ErrorKind.PERMISSION
        assert "act_1002" not in {a.ad_account_id for a in meta.reachable_accounts()}

        assert len(control(server, {"mend": "all"}).json()["changed"]) == 2
        assert control(server).json() == {"staged": []}
        assert list(meta.insights("act_1003", DAY, DAY))
        assert meta.account("act_1002").currency == "JPY"


def test_a_slow_meta_answers_late_and_asks_to_be_asked_again(served):
    world, server = served
    assert control(server, {"stage": "slow"}).status_code == 200
    # The lateness is the server's (`request_delay_seconds`); its words, read in-process.
    assert world.request_delay_seconds == SLOW_ANSWER_SECONDS
    with MetaClient(DEMO_TOKEN, base_url="https://graph.facebook.com/v25.0",
                    transport=FakeGraphTransport(world), max_retries=1,
                    sleep=lambda s: None) as meta:
        assert kind_of(lambda: meta.account("act_1001")) == (ErrorKind.TRANSIENT, None)
        assert world.calls["account"] == 2  # asked again once, as told
        assert control(server, {"mend": "slow"}).status_code == 200
        assert world.request_delay_seconds == 0
        assert meta.account("act_1001").currency == "BRL"


def test_the_demos_graph_file_names_the_header_the_fake_reads():
    from rastro_assets.demo import graph

    assert graph.CONTROL_HEADER == CONTROL_HEADER
