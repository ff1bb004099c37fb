"""A small fake Meta world and clients wired to it, for the meta tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime

import httpx
import pytest

from rastro_assets.meta.client import MetaClient
from rastro_fake_graph import FakeGraphTransport, FakeWorld, MutableClock

# 15:00 in Sao Paulo, 03:00 next day in Tokyo: the two accounts' todays differ.
INSTANT = datetime(2026, 3, 15, 18, 0, tzinfo=UTC)
TOKEN = "EAAtok-DISTINCTIVE-s3cr3t-9f8e7d6c5b4a"
BASE_URL = "https://graph.facebook.com/v25.0"
BRL = "act_2001"
JPY = "act_2002"
FIRST_DAY = date(2026, 1, 1)


class RecordingTransport(httpx.BaseTransport):
    """Passes requests on, keeping each one for assertions."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner
        self.requests: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.inner.handle_request(request)


@pytest.fixture
def clock() -> MutableClock:
    return MutableClock(INSTANT)


@pytest.fixture
def world(clock: MutableClock) -> FakeWorld:
    world = FakeWorld(clock, seed=7)
    world.add_account(BRL, timezone="America/Sao_Paulo", currency="BRL", name="Loja Aurora",
                      n_ads=12, token=TOKEN, first_day=FIRST_DAY)
    world.add_account(JPY, timezone="Asia/Tokyo", currency="JPY", name="東京ストア",
                      n_ads=8, token=TOKEN, first_day=FIRST_DAY)
    return world


ClientFactory = Callable[..., MetaClient]


@pytest.fixture
def client_for(world: FakeWorld) -> Iterator[ClientFactory]:
    """Build clients on the in-process fake; they never sleep for real."""
    clients: list[MetaClient] = []

    def build(token: str = TOKEN, **kwargs) -> MetaClient:
        kwargs.setdefault("sleep", lambda seconds: None)
        kwargs.setdefault("transport", FakeGraphTransport(world))
        client = MetaClient(token, base_url=BASE_URL, **kwargs)
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.close()


@pytest.fixture
def client(client_for: ClientFactory) -> MetaClient:
    return client_for()


def truth_rows(world: FakeWorld, account: str, since: date, until: date):
    """The world's truth over a range, as comparable tuples."""
    out = set()
    day = since
    while day <= until:
        for row in world.truth(account, day):
            out.add(row)
        day = date.fromordinal(day.toordinal() + 1)
    return out
