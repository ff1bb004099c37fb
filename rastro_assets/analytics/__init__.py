"""What analysts get: the snapshot published for them and the tools to query it.

The pipeline's own DuckDB file is opened only by the product's processes, in
short connections. Analysts query the analytics snapshot instead, a separate
file republished atomically after writes (`publish`), from SQL (`rastro sql`,
DBeaver, the DuckDB shell) or from a notebook (`frames`).
"""
