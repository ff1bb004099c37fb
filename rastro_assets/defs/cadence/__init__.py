"""When accounts sync: the sensors, the backfills and waves they start, the accounts' health."""
