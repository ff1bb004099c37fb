"""Incidents and where operators hear of them."""
