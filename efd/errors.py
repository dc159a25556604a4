"""efd's own exceptions: one hierarchy, so callers catch what efd means, not a driver's type.

- `ClientError`: the client asked for something efd refuses. It carries what the HTTP answer
  says (status, code, message, the field at fault) and is rendered in one place
  (efd/http/responses.py); the CLI prints it and exits 2.
- `StoreError` and its kinds: the database could not do what was asked. The store wraps its
  driver's exceptions into these at its edge, so nothing outside efd/store imports
  SQLAlchemy's or psycopg's exceptions. Their messages hold the driver's first line only:
  its details (the statement's parameters, PostgreSQL's DETAIL and CONTEXT) can quote the
  data, which is the clients', and stay on the chained driver exception.
"""

from __future__ import annotations

from typing import Any


class EfdError(Exception):
    """Base of every exception efd raises on purpose."""


class ClientError(EfdError):
    """A request efd refuses, changing nothing: answered with `status` and a JSON body
    `{"success": false, "code", "message", "field"?, "index"?}`; a 401 names in `challenge`
    the scheme to authenticate with (the answer's WWW-Authenticate) when it has one to
    offer. The CLI prints `message` and exits 2."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        field: str | None = None,
        index: int | None = None,
        status: int = 400,
        challenge: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.index = index
        self.status = status
        self.challenge = challenge

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"success": False, "code": self.code, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        if self.index is not None:
            body["index"] = self.index
        return body


class StoreError(EfdError):
    """The database failed to do what was asked; nothing of the failed call is committed."""


class StoreUnavailable(StoreError):
    """The database cannot be reached or written now (connection lost, disk full, locked):
    worth retrying later."""


class StoreDataError(StoreError):
    """The database refused a value it was given (text it cannot hold, a number out of its
    range): the data's fault, not the store's. The same data fails the same way again;
    other writes are unaffected, so it says nothing about whether the store is available."""


class LeaseLost(StoreError):
    """A fenced write found its lease taken over by another claim: this process's work on
    that row is void."""
