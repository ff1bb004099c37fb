"""Configuration read from the environment, in one place.

The contract names the variables; everything else reads them through here so
a test can build a `Settings` without touching `os.environ`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_DUCKDB_PATH = "data/rastro.duckdb"
DEFAULT_GRAPH_URL = "https://graph.facebook.com/v25.0"


@dataclass(frozen=True)
class Settings:
    duckdb_path: str = DEFAULT_DUCKDB_PATH
    graph_url: str = DEFAULT_GRAPH_URL
    use_fake_graph: bool = False

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        return cls(
            duckdb_path=env.get("RASTRO_DUCKDB_PATH") or DEFAULT_DUCKDB_PATH,
            graph_url=(env.get("RASTRO_META_GRAPH_URL") or DEFAULT_GRAPH_URL).rstrip("/"),
            use_fake_graph=(
                env.get("RASTRO_META_FAKE", "").strip().lower() in {"1", "true", "yes"}
            ),
        )
