"""A deterministic, faithful fake of the Meta Graph API (in-process and loopback).

`FakeWorld` holds the truth; `LimitModel` chooses which of Meta's rate limits it enforces;
`FakeGraphTransport` answers in-process for `httpx`; `serve()` answers over real sockets on
loopback, and with a control key stages trouble in its world (`trouble`).
"""

from __future__ import annotations

import functools

from rastro_fake_graph.app import FakeGraphTransport, FakeResponse, handle
from rastro_fake_graph.limits import LimitModel
from rastro_fake_graph.server import FakeGraphServer, run_server, serve
from rastro_fake_graph.world import (
    CDN_BASE,
    DEMO_TOKEN,
    FAILURES,
    FakeWorld,
    Figures,
    MutableClock,
)


@functools.cache
def demo_world() -> FakeWorld:
    """The process-wide demo world (system clock), shared by every fake client."""
    return FakeWorld.demo()


__all__ = [
    "CDN_BASE",
    "DEMO_TOKEN",
    "FAILURES",
    "FakeGraphServer",
    "FakeGraphTransport",
    "FakeResponse",
    "FakeWorld",
    "Figures",
    "LimitModel",
    "MutableClock",
    "demo_world",
    "handle",
    "run_server",
    "serve",
]
