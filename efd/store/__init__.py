"""Persistence: tables, migrations and every SQL statement.

`Store` (queue.py) holds the engines and the queue's statements; the feature stores
(profiles.py, computations.py, regulations.py) run theirs on the same engines.
"""

from efd.store.queue import Store

__all__ = ["Store"]
