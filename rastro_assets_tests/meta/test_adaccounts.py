"""The ad accounts a token reaches: the fake Graph's listings as the facts page gives them,
and the client reading every page of `/me/adaccounts` over real sockets."""

from __future__ import annotations

import httpx
import pytest

from rastro_assets.meta.client import MetaClient
from rastro_assets.meta.errors import ErrorKind, MalformedResponse, MetaError
from rastro_assets.meta.models import AdAccount
from rastro_assets.meta.parse import parse_listed_account
from rastro_assets_tests.meta.conftest import BASE_URL, BRL, JPY, TOKEN
from rastro_fake_graph import FakeGraphTransport, FakeWorld, serve

MANY = 250
FIELDS = "account_id,name,currency,timezone_name,account_status"


@pytest.fixture
def many(world: FakeWorld) -> FakeWorld:
    """`TOKEN` reaches BRL, JPY and `MANY` more accounts, one of them closed."""
    for number in range(1, MANY + 1):
        world.add_account(f"act_{5000 + number}", timezone="Europe/Lisbon", currency="EUR",
                          n_ads=0, token=TOKEN, account_status=101 if number == 7 else 1)
    world.add_account("act_9", timezone="UTC", currency="USD", n_ads=0, token="EAAsomeoneElse1")
    return world


def get(world: FakeWorld, url: str, token: str = TOKEN) -> httpx.Response:
    with httpx.Client(transport=FakeGraphTransport(world)) as http:
        return http.get(url, headers={"Authorization": f"Bearer {token}"})


def test_the_listing_pages_as_the_facts_page_says(many: FakeWorld):
    url = f"{BASE_URL}/me/adaccounts?fields={FIELDS}&limit=40"
    seen: list[str] = []
    pages = 0
    while url:
        body = get(many, url).json()
        pages += 1
        assert set(body) == {"data", "paging"}
        assert 1 <= len(body["data"]) <= 40
        assert {"before", "after"} <= set(body["paging"]["cursors"])
        for account in body["data"]:
            assert set(account) == {"id", *FIELDS.split(",")}
            assert account["id"] == f"act_{account['account_id']}"
        seen += [account["id"] for account in body["data"]]
        url = body["paging"].get("next")
    assert pages >= (MANY + 2) // 40
    assert sorted(seen) == sorted([BRL, JPY, *(f"act_{5000 + n}" for n in range(1, MANY + 1))])
    assert len(seen) == len(set(seen))


def test_the_listing_defaults_to_id_and_account_id_and_caps_limit(many: FakeWorld):
    body = get(many, f"{BASE_URL}/me/adaccounts?limit=100000").json()
    assert len(body["data"]) <= many.max_page_size
    assert set(body["data"][0]) == {"id", "account_id"}
    nobody = get(many, f"{BASE_URL}/me/adaccounts", token="EAAnobodyKnowsThis1")
    assert nobody.status_code == 400 and nobody.json()["error"]["code"] == 190


def test_a_business_lists_its_own_and_its_clients_accounts(many: FakeWorld):
    business = many.accounts[BRL].business_id
    many.add_client_account(business, "act_5001")
    owned = get(many, f"{BASE_URL}/{business}/owned_ad_accounts?fields=name").json()
    clients = get(many, f"{BASE_URL}/{business}/client_ad_accounts").json()
    assert [account["id"] for account in owned["data"]] == [BRL]
    assert [account["id"] for account in clients["data"]] == ["act_5001"]
    assert "next" not in owned["paging"]
    stranger = get(many, f"{BASE_URL}/{business}/owned_ad_accounts", token="EAAsomeoneElse1")
    assert (stranger.status_code, stranger.json()["error"]["code"]) == (403, 200)


def test_the_client_reads_every_page_over_sockets(many: FakeWorld):
    with serve(many) as server, MetaClient(TOKEN, base_url=server.base_url, page_size=30,
                                           sleep=lambda seconds: None) as client:
        reached = client.reachable_accounts()
        assert client.stats.api_calls >= (MANY + 2) // 30
    assert len(reached) == MANY + 2
    by_id = {account.ad_account_id: account for account in reached}
    assert by_id[BRL] == AdAccount(BRL, "Loja Aurora", "BRL", "America/Sao_Paulo", 1)
    assert (by_id["act_5007"].status_name, by_id[JPY].status_name) == ("CLOSED", "ACTIVE")
    assert "act_9" not in by_id


def test_the_client_keeps_retrying_and_classifying(many: FakeWorld, client_for):
    many.fail("adaccounts", "transient", skip=1)
    assert len(client_for(page_size=50).reachable_accounts()) == MANY + 2
    many.kill_token(TOKEN)
    with pytest.raises(MetaError) as failed:
        client_for().reachable_accounts()
    assert failed.value.kind is ErrorKind.TOKEN
    assert TOKEN not in str(failed.value)


@pytest.mark.parametrize(
    "raw",
    [{"name": "x", "currency": "USD", "timezone_name": "UTC"},
     {"id": "act_1", "account_id": "2", "currency": "USD", "timezone_name": "UTC"},
     {"id": "page_1", "currency": "USD", "timezone_name": "UTC"},
     {"id": "act_1", "timezone_name": "UTC"}],
    ids=["no-id", "ids-apart", "not-an-account", "no-currency"],
)
def test_a_listed_account_meta_would_not_send_is_malformed(raw):
    with pytest.raises(MalformedResponse):
        parse_listed_account(raw)


def test_an_undocumented_status_shows_as_its_number():
    assert AdAccount("act_1", None, "USD", "UTC", 42).status_name == "42"
    assert AdAccount("act_1", None, "USD", "UTC").status_name is None
