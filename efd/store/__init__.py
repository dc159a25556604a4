"""Persistence: tables, migrations and every SQL statement."""

from efd.store.sql import AttemptRow, Claimed, NewMessage, Outcome, Store

__all__ = ["AttemptRow", "Claimed", "NewMessage", "Outcome", "Store"]
