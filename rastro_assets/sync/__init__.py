"""Syncs: read Meta, write the warehouse, say how it went. Knows nothing of Dagster.

- `types`: what is asked (`SyncRequest`) and what came of it (the outcomes).
- `reader`: Meta's spend answer as write batches; it never writes.
- `spend`: one account's spend: its run's lease, its read (which never writes), its end.
- `spend_writer`: the one spend writer: a large read streamed as it comes, small reads
  batched across accounts.
- `catalog`: one account's ad catalog and thumbnails.
- `syncer`: the one caller of both: a sync or a wave of syncs, the catalog
  chained after the spend, and the outcome it owns.
"""
