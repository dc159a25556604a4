"""`efd map`: the request one action would send for a message, or why none would be, without
sending anything (docs/actions.md#efd-map).

The message is read as ingestion reads a `/v1/<type>` body and routed by the same code
(efd.segment.payload.parse_request): what is printed is what routing would store.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime

from efd import config
from efd.delivery import outauth
from efd.errors import ClientError
from efd.segment.payload import WriteKeys, parse_request
from efd.segment.routing import NO_TRIGGER_MATCHED

_TYPES = ("identify", "track", "page", "screen", "group", "alias")
MASK = outauth.MASK


@dataclass(frozen=True)
class _Source:
    name: str
    destinations: tuple[str, ...]


def _fail(why: str) -> int:
    print(f"efd map: {why}", file=sys.stderr)
    return 1


def _authorization(auth: outauth.Auth) -> str:
    return f"Basic {MASK}" if isinstance(auth, outauth.Basic) else f"Bearer {MASK}"


def cmd_map(args: argparse.Namespace) -> int:
    try:
        settings = config.load(args.config)
    except config.ConfigError as error:
        print(f"efd map: invalid configuration ({error.count}):", file=sys.stderr)
        for problem in error.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    try:
        destination = settings.destination(args.destination)
    except KeyError:
        return _fail(f"no destination named {args.destination!r}")
    if destination.type != "actions":
        return _fail(f"{args.destination!r} is a webhooks destination, without actions")
    action = next((a for a in destination.actions if a.name == args.action), None)
    if action is None:
        names = ", ".join(a.name for a in destination.actions)
        return _fail(f"{args.destination!r} has no action named {args.action!r} (it has {names})")
    data = sys.stdin.buffer.read()
    try:
        payload = json.loads(data)
    except ValueError:
        payload = None
    kind = payload.get("type") if isinstance(payload, dict) else None
    type_ = kind if isinstance(kind, str) and kind in _TYPES else "track"
    source = _Source("efd-map", (destination.name,))
    try:
        _, [row] = parse_request(
            data,
            source=source,
            keys=WriteKeys({}),
            type_=type_,
            received_at=datetime.now(UTC),
            filters=settings.filter_sets(),
            actions=settings.action_sets(),
        )
    except ClientError as error:
        return _fail(f"the message would be refused: {error.message}")
    route = destination.route_name(action)
    for name, _, reason in row.shaped:
        # A destination filter's reason; "no trigger matched" is told of this action below.
        if name == destination.name and reason not in (None, NO_TRIGGER_MATCHED):
            return _fail(f"no request: {reason}")
    if not row.shaped and not row.mapped:
        return _fail(f"no request: the message's integrations turn {destination.name!r} off")
    found = next((m for m in row.mapped if m[0] == route), None)
    if found is None:
        return _fail(f"no request: the trigger does not match: {action.trigger}")
    _, body, url, why = found
    if why is not None or body is None:
        return _fail(f"no request: {why}")
    # None: the action's URL has no template, and the request goes to it as configured.
    print(f"{action.method} {url if url is not None else action.url}")
    for name, value in action.headers.items():
        print(f"{name}: {value}")
    print(f"Content-Type: {action.content_type}")
    print(f"User-Agent: {settings.delivery.user_agent}")
    auth = action.outbound_auth
    if auth is not None:
        print(f"Authorization: {_authorization(auth)}")
    if destination.shared_secret and "x-signature" in destination.signing:
        print(f"X-Signature: {MASK} (computed when sent)")
    if "standard-webhooks" in destination.signing:
        for name in ("webhook-id", "webhook-timestamp", "webhook-signature"):
            print(f"{name}: {MASK} (computed when sent)")
    print()
    print(body)
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    mapper = sub.add_parser(
        "map",
        help="print the request an action would send for a message read from stdin, or why "
        "none would be",
    )
    mapper.add_argument("--config", required=True)
    mapper.add_argument("--destination", required=True, help="an actions destination's name")
    mapper.add_argument("--action", required=True, help="one of its actions' names")
    mapper.set_defaults(func=cmd_map)
