"""Listing, renaming and removing sites: what each refuses, and that a refusal writes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest

from rastro_assets.warehouse import link_store, registry, site_store
from rastro_assets.warehouse.connection import transaction
from rastro_assets.warehouse.registry import RegistryError
from rastro_assets.warehouse.site_store import Site


def test_list_sites_counts_each_sites_links(con, now, linked_account):
    site_store.add_site(con, "s2", None, now + timedelta(hours=1))
    link_store.link_account(con, "s2", linked_account, "c1", "America/Sao_Paulo", "BRL", now)
    link_store.link_account(con, "s2", "act_2", "c1", "UTC", "USD", now)
    site_store.add_site(con, "a0", "First", now)
    assert site_store.list_sites(con) == [
        Site("a0", "First", now, 0),
        Site("s1", "Site one", now, 1),
        Site("s2", None, now + timedelta(hours=1), 2),
    ]


def test_rename_site_returns_the_old_name(con, now, linked_account):
    assert site_store.rename_site(con, "s1", "Shop") == "Site one"
    assert site_store.rename_site(con, "s1", "Shop two") == "Shop"
    assert con.execute("SELECT site_id, name, created_at FROM sites").fetchall() == [
        ("s1", "Shop two", now)
    ]
    # The links stay: a rename changes only what the site is called.
    assert [a.sites for a in registry.linked_accounts(con)] == [("s1",)]


def test_renaming_an_unknown_site_is_refused(con, now):
    with pytest.raises(RegistryError, match="unknown site 'ghost'"):
        site_store.rename_site(con, "ghost", "Shop")
    assert site_store.list_sites(con) == []


def test_a_site_that_links_accounts_is_not_removed(con, now, linked_account):
    with pytest.raises(RegistryError, match=r"still links 1 ad account \(act_1\)"):
        site_store.remove_site(con, "s1")
    assert [site.site_id for site in site_store.list_sites(con)] == ["s1"]
    link_store.unlink_account(con, "s1", linked_account)
    site_store.remove_site(con, "s1")
    assert site_store.list_sites(con) == []


def test_removing_an_unknown_site_is_refused(con, now):
    site_store.add_site(con, "s1", None, now)
    with pytest.raises(RegistryError, match="unknown site 'ghost'"):
        site_store.remove_site(con, "ghost")
    assert [site.site_id for site in site_store.list_sites(con)] == ["s1"]


def test_site_changes_join_an_outer_transaction(con, now):
    site_store.add_site(con, "s1", "One", now)
    site_store.add_site(con, "s2", "Two", now)
    with pytest.raises(RuntimeError), transaction(con):
        site_store.rename_site(con, "s1", "Renamed")
        site_store.remove_site(con, "s2")
        raise RuntimeError("the caller's work failed")
    assert site_store.list_sites(con) == [Site("s1", "One", now, 0), Site("s2", "Two", now, 0)]
