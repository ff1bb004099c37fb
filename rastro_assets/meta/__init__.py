"""The Meta Graph API: client, typed models and errors (the fake Graph is `rastro_fake_graph`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rastro_assets.meta.client import MetaClient

if TYPE_CHECKING:
    from rastro_assets.process_settings import Settings

FAKE_GRAPH_BASE_URL = "https://graph.facebook.com/v25.0"


def make_client(settings: Settings, token: str, **kwargs: Any) -> MetaClient:
    """The client the settings call for: the real Graph, or the in-process fake.

    With `use_fake_graph`, requests go to the process-wide demo world through
    an in-process transport (no network); the fake is imported only then.
    """
    if settings.use_fake_graph:
        from rastro_fake_graph import FakeGraphTransport, demo_world

        kwargs.setdefault("transport", FakeGraphTransport(demo_world()))
        return MetaClient(token, base_url=FAKE_GRAPH_BASE_URL, **kwargs)
    return MetaClient(token, base_url=settings.graph_url, **kwargs)


__all__ = ["FAKE_GRAPH_BASE_URL", "MetaClient", "make_client"]
