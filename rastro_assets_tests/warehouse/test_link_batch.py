"""Linking many accounts in one transaction: each decided on its own, written together."""

from __future__ import annotations

from rastro_assets.warehouse import link_store, registry, shard_store, site_store
from rastro_assets.warehouse.link_store import AccountToLink


def test_a_batch_links_refuses_and_places_each_account_on_its_own(con, now, linked_account):
    registry.save_connection(con, "c2", b"\1" * 40, now)
    site_store.add_site(con, "s2", "Site two", now)
    link_store.link_account(con, "s2", "act_9", "c2", "UTC", "USD", now)
    batch = link_store.link_accounts(
        con,
        "s2",
        "c1",
        [
            AccountToLink(linked_account, "America/Sao_Paulo", "BRL", name="Kept"),
            AccountToLink("act_2", "Asia/Tokyo", "jpy", name="Two"),
            AccountToLink("act_3", "Mars/Olympus", "USD"),
            AccountToLink("act_9", "UTC", "USD"),
            AccountToLink("act_4", "UTC", "EUR"),
            AccountToLink("act_5", "UTC", "EUR"),
        ],
        now,
        shards=2,
        shard_size=2,
        max_links=4,
    )
    assert batch.linked == [linked_account, "act_2", "act_4"]
    assert batch.already_linked == []
    refused = {refusal.ad_account_id: refusal.reason for refusal in batch.refused}
    assert list(refused) == ["act_3", "act_9", "act_5"]
    assert "already synced through connection 'c2'" in refused["act_9"]
    assert "already holds 4 links" in refused["act_5"]
    assert batch.shards == {linked_account: 0, "act_2": 1, "act_4": 1}
    assert link_store.links_through(con, "c1") == 4
    assert shard_store.shard_counts(con) == {0: 2, 1: 2}
    assert shard_store.account_shards(con, ["act_2", "act_9", "act_404"]) == {
        "act_2": 1,
        "act_9": 0,
    }
    accounts = {a.ad_account_id: a for a in registry.linked_accounts(con)}
    assert accounts["act_2"].currency == "JPY" and accounts["act_2"].name == "Two"
    assert accounts[linked_account].name == "Kept"
    assert accounts[linked_account].sites == ("s1", "s2")
    assert registry.sites_linking(con, "act_4") == ["s2"]
