"""`ad_spend_daily` and `site_spend_daily` (a pair per shard), and their checks."""
