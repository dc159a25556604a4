"""Delivery: the dispatcher that claims and records, and the sender that POSTs."""
