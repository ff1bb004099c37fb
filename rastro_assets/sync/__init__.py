"""Syncs: read Meta, write the warehouse, say how it went. Knows nothing of Dagster.

- `types`: what is asked (`SyncRequest`) and what came of it (the outcomes).
- `reader`: Meta's spend answer as write batches; it never writes.
- `spend_read`: one account's spend read: its run's lease, its read (which never
  writes and says how it ended), its end.
- `spend_write`: the sync's spend writer: a large read streamed as it comes, small
  reads batched across accounts; it says what it wrote.
- `catalog`: one account's ad catalog and thumbnails.
- `syncer`: the one caller of both: a sync or a wave of syncs, the catalog
  chained after the spend, and the outcome it owns, into which it folds what
  the steps return.
"""
