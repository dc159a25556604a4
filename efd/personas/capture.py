"""Profile capture: one group commit's messages folded into profiles, identity links and
kept events, inside the ingestion transaction (efd/store/ingestion.py calls it), in message
order and with few statements (the SQL is efd/store/profiles.py).

Identity rules: a message with a userId belongs to that user's profile; an anonymousId
seen with a userId is linked to it (and its anonymous profile merged in) unless it is
already linked to another user (a shared device); alias joins the previous id's profile
to the userId's, whatever kind it is. Links are kept flat: alias -> canonical.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from efd.personas.profiles import ANONYMOUS, USER, ProfileState, event_of, merge_into, set_traits
from efd.records import NewMessage
from efd.store.database import Transaction
from efd.store.profiles import Profiles
from efd.store.statements import dumps

_CAPTURED = frozenset({"identify", "track", "page", "screen", "alias"})


class Capture:
    """The store's capture step (`Store.capture`) while audiences or traits are configured."""

    def __init__(self, profiles: Profiles) -> None:
        self._profiles = profiles

    def __call__(self, conn: Transaction, rows: Sequence[NewMessage]) -> None:
        items = [(row, json.loads(row.body)) for row in rows if row.type in _CAPTURED]
        if items:
            _Batch(self._profiles, conn, items).run()


class _Batch:
    """One group commit's messages, applied to the profiles they touch."""

    def __init__(
        self, profiles: Profiles, conn: Transaction, items: list[tuple[NewMessage, Any]]
    ) -> None:
        self.profiles = profiles
        self.conn = conn
        self.items = items
        self.links: dict[str, str] = {}
        self.new_links: dict[str, str] = {}
        self.states: dict[str, ProfileState] = {}
        self.merges: list[tuple[str, str]] = []
        self.pending_events: list[tuple[str, str, float, str]] = []
        self.now = time.time()

    def resolve(self, id_: str) -> str:
        return self.links.get(id_, id_)

    def run(self) -> None:
        raw: set[str] = set()
        for row, body in self.items:
            raw.update(i for i in (row.user_id, row.anonymous_id) if i is not None)
            if row.type == "alias":
                raw.add(body["previousId"])
        self.links.update(self.profiles.links(self.conn, raw))
        resolve = self.resolve
        ensure: dict[str, str] = {}  # profiles the messages need: canonical id -> kind
        lock: set[str] = set()
        for row, body in self.items:
            if row.user_id is not None:
                ensure[resolve(row.user_id)] = USER
                if row.anonymous_id is not None:
                    lock.add(resolve(row.anonymous_id))
                if row.type == "alias":
                    lock.add(resolve(body["previousId"]))
            elif row.anonymous_id is not None:
                ensure.setdefault(resolve(row.anonymous_id), ANONYMOUS)
        self.profiles.ensure(self.conn, ensure, self.now)
        for pid, kind, traits, times in self.profiles.load(self.conn, lock | set(ensure)):
            state = self.states[pid] = ProfileState(pid, kind, traits, times)
            if ensure.get(pid) == USER and kind != USER:
                state.kind = USER
                state.dirty = True
        self.apply()
        self.write()

    def apply(self) -> None:
        resolve = self.resolve
        for row, body in self.items:
            user, anonymous = row.user_id, row.anonymous_id
            if row.type == "alias":
                assert user is not None
                target, previous = resolve(user), resolve(body["previousId"])
                if previous != target:
                    self.merge(previous, target)
                continue
            if user is not None:
                target = resolve(user)
                if anonymous is not None:
                    linked = resolve(anonymous)
                    if linked != target:
                        state = self.states.get(linked)
                        if state is None:
                            if linked == anonymous:
                                self.link(anonymous, target)  # first seen here
                        elif state.kind == ANONYMOUS:
                            self.merge(linked, target)
                        # else: the anonymousId belongs to another user already; keep that.
            else:
                assert anonymous is not None
                target = resolve(anonymous)
            if row.type == "identify":
                traits = body.get("traits")
                if isinstance(traits, dict) and traits:
                    set_traits(self.state(target), traits, row.timestamp)
                continue
            event = event_of(row.type, body)
            if event is not None:
                self.pending_events.append((target, event[0], row.timestamp, dumps(event[1])))

    def state(self, id_: str) -> ProfileState:
        state = self.states.get(id_)
        if state is None:  # not expected: every target was ensured; stay correct anyway
            state = self.states[id_] = ProfileState(id_, USER)
            state.dirty = True
        return state

    def link(self, alias: str, canonical: str) -> None:
        self.links[alias] = canonical
        self.new_links[alias] = canonical

    def merge(self, source: str, target: str) -> None:
        previous = self.states.pop(source, None)
        if previous is not None:
            merge_into(previous, self.state(target))
            self.merges.append((source, target))
        for alias, canonical in self.links.items():
            if canonical == source:
                self.links[alias] = target
                if alias in self.new_links:
                    self.new_links[alias] = target
        self.link(source, target)

    def write(self) -> None:
        conn, profiles = self.conn, self.profiles
        for source, target in self.merges:
            profiles.merge(conn, source, target)
        profiles.save_links(conn, {a: self.resolve(a) for a in self.new_links}, self.now)
        profiles.save(
            conn,
            [
                (s.id, s.kind, s.traits_json(), s.times_json())
                for s in self.states.values()
                if s.dirty
            ],
            self.now,
        )
        profiles.add_events(
            conn,
            (
                (self.resolve(target), name, timestamp, properties)
                for target, name, timestamp, properties in self.pending_events
            ),
        )
