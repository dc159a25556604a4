"""The `efd` command: serve, migrate, check-config, audiences, listen, check-receiver,
message-key, and the operator's inspect, deliveries, redrive, replay and discard."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from efd import config
from efd.errors import ClientError
from efd.observe import logs

log = logging.getLogger("efd")


def _load(path: str) -> config.Settings:
    try:
        return config.load(path)
    except config.ConfigFileError as error:
        print(f"efd: {error}", file=sys.stderr)  # one line: the file and why, none of it
        raise SystemExit(2) from None
    except config.ConfigError as error:
        print(f"efd: invalid configuration ({len(error.problems)} problems):", file=sys.stderr)
        for problem in error.problems:
            print(f"  {problem}", file=sys.stderr)
        raise SystemExit(2) from None


def _run_loop(coro: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


def cmd_serve(args: argparse.Namespace) -> int:
    from efd.daemon import StartupError, run

    settings = _load(args.config)
    logs.setup(settings.logging.level, settings.logging.format)
    try:
        _run_loop(run(settings, config_path=args.config))
    except StartupError as error:
        log.error("%s", error)
        return 1
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from efd.store import migrate

    settings = _load(args.config)
    logs.setup(settings.logging.level, settings.logging.format)
    migrate.upgrade(settings.storage.url)
    print(f"database at revision {migrate.current_revision(settings.storage.url)}")
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    settings = _load(args.config)
    counts = f"{len(settings.sources)} sources, {len(settings.destinations)} destinations"
    if settings.audiences or settings.computed_traits:
        counts += (
            f", {len(settings.audiences)} audiences, "
            f"{len(settings.computed_traits)} computed traits"
        )
    print(f"{args.config}: OK ({counts})")
    return 0


def _when(value: float | None) -> str:
    from datetime import UTC, datetime

    from efd.rules.messages import format_timestamp

    return "never" if value is None else format_timestamp(datetime.fromtimestamp(value, UTC))


def cmd_audiences(args: argparse.Namespace) -> int:
    from efd.personas.sync import AUDIENCE, TRAIT, Computation, preview
    from efd.rules.audiences import ParseError
    from efd.services.periodic import computations
    from efd.store import Store, migrate
    from efd.store.computations import ComputationsStore
    from efd.store.suppressions import Suppressions

    settings = _load(args.config)
    url = settings.storage.url
    if migrate.current_revision(url) != migrate.head_revision():
        print("efd: the database is not migrated yet: run `efd migrate` (or start efd serve)")
        return 1
    store = Store(url, pool_size=1)
    personas = ComputationsStore(store, Suppressions(store))
    try:
        configured = computations(settings)
        if args.preview is None:
            rows = personas.computation_rows()
            print(
                f"{'kind':9} {'name':30} {'trait':30} {'count':>9}  {'last sync':24}  destinations"
            )
            for c in configured:
                row = rows.pop(c.store_key, None)
                count = row.values if row else 0
                last = _when(row.last_success_at if row else None)
                print(
                    f"{c.kind:9} {c.name:30} {c.key:30} {count:>9}  {last:24}  "
                    f"{', '.join(c.destinations)}"
                )
                if row is not None and row.last_error:
                    print(f"{'':9} last attempt failed: {row.last_error}")
            for row in rows.values():
                print(
                    f"{row.kind:9} {row.name:30} {row.key.split(':', 1)[1]:30} {row.values:>9}  "
                    f"{_when(row.last_success_at):24}  (no longer configured)"
                )
            print("count: audience members, or profiles with a value of the computed trait")
            return 0
        target = next((c for c in configured if args.preview in (c.name, c.key)), None)
        known = target is not None
        if target is None:
            try:
                target = Computation(AUDIENCE, "preview", args.preview)
            except ParseError as condition_error:
                try:
                    target = Computation(TRAIT, "preview", args.preview)
                except ParseError:
                    print(f"efd: not an audience or trait name, nor a condition: {condition_error}")
                    return 2
        result = preview(personas, target, sample=args.sample)
        if known:
            what = "audience" if target.kind == AUDIENCE else "computed trait"
            print(f"preview of {what} {target.name!r} (nothing is delivered or stored):")
        else:
            what = "condition" if target.kind == AUDIENCE else "expression"
            print(f"preview of the {what} {target.text} (nothing is delivered or stored):")
        selected = "selects" if target.kind == AUDIENCE else "has a value for"
        print(f"  {selected} {result.selected} of {result.profiles} user profiles")
        if known:
            changed = "would enter" if target.kind == AUDIENCE else "would get a new value"
            left = "would leave" if target.kind == AUDIENCE else "would lose their value"
            print(f"  against the last sync: {result.entering} {changed}, {result.leaving} {left}")
        for pid, value in result.sample:
            print(f"  {pid}" if target.kind == AUDIENCE else f"  {pid} = {json.dumps(value)}")
        return 0
    finally:
        store.dispose()


def cmd_listen(args: argparse.Namespace) -> int:
    from efd.cli.listen import serve
    from efd.rules.webhooks import standard_secret

    for secret in args.standard_webhooks_secret or []:
        try:
            standard_secret(secret)
        except ValueError as error:
            print(f"efd listen: --standard-webhooks-secret {error}", file=sys.stderr)
            return 2
    _run_loop(
        serve(
            args.host,
            args.port,
            args.secret or [],
            args.status,
            args.standard_webhooks_secret or [],
        )
    )
    return 0


def cmd_check_receiver(args: argparse.Namespace) -> int:
    from urllib.parse import urlsplit

    from efd import tls
    from efd.cli.check_receiver import check, report
    from efd.rules.receiver_check import Row, passed
    from efd.rules.webhooks import ClientCert, standard_secret

    def usage(problem: str) -> int:
        print(f"efd check-receiver: {problem}", file=sys.stderr)
        return 2

    parts = urlsplit(args.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return usage("the URL must be a full http:// or https:// URL")
    if not (args.secret or args.standard_webhooks_secret):
        return usage(
            "give the receiver's secrets: --secret and/or --standard-webhooks-secret, "
            "as for efd listen"
        )
    keys = []
    for secret in args.standard_webhooks_secret or []:
        try:
            keys.append(standard_secret(secret))
        except ValueError as error:
            return usage(f"--standard-webhooks-secret {error}")
    if not args.timeout > 0:
        return usage("--timeout must be a positive number of seconds")
    if args.ca_file and (problem := tls.unreadable(args.ca_file)):
        return usage(f"--ca-file: {problem}")
    client: ClientCert | None = None
    if args.client_key and not args.client_cert:
        return usage("--client-key needs --client-cert")
    if args.client_cert:
        try:
            client = tls.check(args.client_cert, args.client_key)
        except tls.ClientCertError as error:
            return usage(f"--client-cert: {error}")
    rows: list[Row] = []

    async def run() -> None:
        rows.extend(
            await check(
                args.url,
                args.secret or [],
                keys,
                timeout=args.timeout,
                user_agent=config.DeliveryConfig().user_agent,
                ca_file=args.ca_file,
                client=client,
            )
        )

    _run_loop(run())
    print(report(args.url, rows))
    return 0 if passed(rows) else 1


def cmd_message_key(args: argparse.Namespace) -> int:
    from efd.store.dedupe import message_key

    print(message_key(args.source, args.message_id))
    return 0


# -- the operator's commands: the rules of efd/rules/selection.py, as the admin API --


def _operations(args: argparse.Namespace) -> tuple[config.Settings, Any, Any]:
    """(settings, store, operations) for a command that works on the database directly,
    beside a running daemon or without one."""
    from efd.store import Store, migrate
    from efd.store.operations import OperationsStore

    settings = _load(args.config)
    url = settings.storage.url
    if migrate.current_revision(url) != migrate.head_revision():
        print("efd: the database is not migrated yet: run `efd migrate`", file=sys.stderr)
        raise SystemExit(1)
    store = Store(url, pool_size=1)
    return settings, store, OperationsStore(store)


def _operator_command(run: Any) -> Any:
    """Runs `run(args, settings, operations)`: an unreachable store exits 1 (bad arguments
    exit 2, by main)."""

    def command(args: argparse.Namespace) -> int:
        from efd.errors import StoreError

        settings, store, operations = _operations(args)
        try:
            code: int = run(args, settings, operations)
            return code
        except StoreError as error:
            print(f"efd {args.command}: the store is unavailable: {error}", file=sys.stderr)
            return 1
        finally:
            store.dispose()

    return command


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _short(value: str | None, width: int) -> str:
    text = "-" if value is None else value
    return text if len(text) <= width else text[: width - 1] + "…"


def _inspect(args: argparse.Namespace, settings: config.Settings, operations: Any) -> int:
    from efd.rules.lanes import waiting_note
    from efd.rules.selection import message_json

    found = operations.message(args.source, args.message_id)
    if found is None:
        print(
            f"efd inspect: no message {args.message_id!r} from source {args.source!r} is stored",
            file=sys.stderr,
        )
        return 1
    shown = message_json(found, settings.delivery.retry_window_seconds)
    if args.json:
        _print_json(shown)
        return 0
    what = shown["type"] + (f" {shown['event']!r}" if shown["event"] else "")
    print(f"message {shown['messageId']} from {shown['source']}: {what}")
    print(f"  userId {shown['userId'] or '-'}, anonymousId {shown['anonymousId'] or '-'}")
    print(f"  received {shown['receivedAt']}")
    if shown["body"] is None:
        print("  body: purged by a deletion request")
    else:
        print(f"  body: {json.dumps(shown['body'], ensure_ascii=False)}")
    for d in shown["deliveries"]:
        replay = f", replay of delivery {d['replayOf']}" if d["replayOf"] else ""
        print(
            f"delivery {d['id']} to {d['destination']}: {d['status']}, rounds sent: "
            f"{d['attemptCount']}{replay}"
        )
        if d["filteredBy"]:
            print(f"  filtered at routing, never sent: {d['filteredBy']}")
            continue
        if d["nextAttemptAt"]:
            print(f"  next attempt {d['nextAttemptAt']}")
        if d["status"] == "queued":
            print(f"  {waiting_note(d['waitingFor'])}")
        print(f"  retry window ends {d['windowEndsAt']}")
        if not d["attempts"]:
            print("  no attempts yet")
        for a in d["attempts"]:
            result = str(a["statusCode"]) if a["statusCode"] is not None else a["error"]
            duration = f"{a['durationMs']:.1f} ms" if a["durationMs"] is not None else "-"
            print(f"  {a['at']}  {a['url']}  {result}  {duration}")
            if a["statusCode"] is not None and a["error"]:
                print(f"    error: {a['error']}")
            if a["response"]:
                print(f"    response: {_short(' '.join(a['response'].split()), 100)}")
    return 0


def _given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The named options the command line set, keyed as the admin API's filters are."""
    return {name: value for name in names if (value := getattr(args, name)) is not None}


def _deliveries(args: argparse.Namespace, settings: config.Settings, operations: Any) -> int:
    import time

    from efd.rules.selection import list_query, page_json

    given = _given(
        args,
        "destination",
        "status",
        "since",
        "until",
        "user_id",
        "message_id",
        "source",
        "limit",
        "cursor",
    )
    query, limit, cursor = list_query(given, time.time())
    found = operations.deliveries(query, limit=limit + 1, before=cursor)
    page = page_json(found, limit, settings.delivery.retry_window_seconds)
    if args.json:
        _print_json(page)
        return 0
    print(
        f"{'id':>8}  {'received':24}  {'source':12}  {'messageId':36}  {'destination':16}  "
        f"{'status':9}  {'rounds':>6}  {'next attempt':24}  userId"
    )
    for d in page["deliveries"]:
        status = d["status"] + ("*" if d["replayOf"] else "")
        print(
            f"{d['id']:>8}  {d['receivedAt']:24}  {_short(d['source'], 12):12}  "
            f"{_short(d['messageId'], 36):36}  {_short(d['destination'], 16):16}  {status:9}  "
            f"{d['attemptCount']:>6}  {d['nextAttemptAt'] or '-':24}  {_short(d['userId'], 30)}"
        )
    if not page["deliveries"]:
        print("(no deliveries match)")
    if any(d["replayOf"] for d in page["deliveries"]):
        print("* a replay")
    if page["nextCursor"]:
        print(f"more: add --cursor {page['nextCursor']}")
    return 0


def _redrive(args: argparse.Namespace, settings: config.Settings, operations: Any) -> int:
    import time

    from efd.rules.selection import redrive_query

    query, dry_run = redrive_query(
        _given(args, "destination", "status", "since", "until", "dry_run"),
        time.time(),
        {d.name for d in settings.destinations},
    )
    count = (
        operations.count_redrivable(query) if dry_run else operations.redrive(query, time.time())
    )
    if args.json:
        _print_json({"count": count})
    elif dry_run:
        print(f"deliveries that would be sent again: {count} (dry run: nothing changed)")
    else:
        print(f"deliveries pending again, due now: {count}")
    return 0


def _lanes(args: argparse.Namespace, settings: config.Settings, operations: Any) -> int:
    from efd.rules.selection import lanes_json

    blocked = operations.blocked_lanes()
    shown = {
        d.name: lanes_json(blocked.get(d.name))
        for d in settings.destinations
        if d.ordering == "per_user"
    }
    if args.json:
        _print_json({"destinations": [{"name": name, "lanes": v} for name, v in shown.items()]})
        return 0
    if not shown:
        print('no destination is ordered (ordering = "per_user")')
    for name, lanes in shown.items():
        line = f"{name}: {lanes['blocked']} blocked lanes"
        if lanes["blocked"]:
            line += (
                f"; blocked longest: message {lanes['oldestBlockedMessageId']}, "
                f"since {lanes['oldestBlockedSince']}"
            )
        print(line)
    return 0


def _discard(args: argparse.Namespace, settings: config.Settings, operations: Any) -> int:
    import time

    from efd.rules.selection import DISCARD_CHUNK, discard_query

    query, dry_run = discard_query(
        _given(args, "destination", "since", "until", "dry_run"),
        time.time(),
        {d.name for d in settings.destinations},
    )
    name = query.destinations[0]
    if dry_run:
        count = operations.count_discardable(query)
    else:
        count, now = 0, time.time()
        while marked := operations.discard(query, now, DISCARD_CHUNK):
            count += marked
            if marked < DISCARD_CHUNK:
                break
    if args.json:
        _print_json({"count": count})
    elif dry_run:
        print(f"pending deliveries to {name} that would be discarded: {count} (dry run)")
    else:
        print(
            f"pending deliveries to {name} discarded: {count} (kept as 'discarded' until "
            "retention purges them)"
        )
    return 0


def _replay(args: argparse.Namespace, settings: config.Settings, operations: Any) -> int:
    import time

    from efd.rules.selection import replay_json, replay_targets

    found = operations.replay_sources(args.source, args.message_id)
    if found is None:
        print(
            f"efd replay: no message {args.message_id!r} from source {args.source!r} is stored",
            file=sys.stderr,
        )
        return 1
    pk, kept, originals = found
    if not kept:
        print(
            "efd replay: a deletion request purged this message's payload; it cannot be sent again",
            file=sys.stderr,
        )
        return 1
    targets = replay_targets(originals, args.destination, {d.name for d in settings.destinations})
    created = operations.replay(pk, targets, time.time())
    ordered = {d.name for d in settings.destinations if d.ordering == "per_user"}
    if args.json:
        _print_json(replay_json(created, ordered))
    else:
        for delivery_id, name in created:
            late = ", out of order: not through its lane" if name in ordered else ""
            print(f"delivery {delivery_id} to {name}: a replay of what routing made of it{late}")
    return 0


def _operator_parsers(sub: Any) -> None:
    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--config", required=True, help="path of the TOML configuration")
        parser.add_argument("--json", action="store_true", help="print JSON")

    when = "ISO 8601, or relative: 2h, 30m, 1d ago"
    inspect = sub.add_parser("inspect", help="a message: its body, deliveries and every attempt")
    common(inspect)
    inspect.add_argument("--source", required=True)
    inspect.add_argument("--message-id", required=True)
    inspect.set_defaults(func=_operator_command(_inspect))

    listing = sub.add_parser("deliveries", help="deliveries, newest first, filtered")
    common(listing)
    listing.add_argument("--destination")
    listing.add_argument("--status", help="pending|delivered|failed|expired|discarded|filtered")
    listing.add_argument("--since", help=f"messages received since: {when}")
    listing.add_argument("--until", help=f"messages received before: {when}")
    listing.add_argument("--user-id")
    listing.add_argument("--message-id")
    listing.add_argument("--source")
    listing.add_argument("--limit", help="at most this many (default 50, at most 500)")
    listing.add_argument("--cursor", help="the next page, as the previous one printed")
    listing.set_defaults(func=_operator_command(_deliveries))

    redrive = sub.add_parser(
        "redrive", help="send failed or expired deliveries again, with a fresh retry window"
    )
    common(redrive)
    redrive.add_argument("--destination")
    redrive.add_argument("--status", help="failed|expired (default both)")
    redrive.add_argument("--since", help=f"messages received since: {when}")
    redrive.add_argument("--until", help=f"messages received before: {when}")
    redrive.add_argument(
        "--dry-run", action="store_true", help="count what would be sent, change nothing"
    )
    redrive.set_defaults(func=_operator_command(_redrive))

    replay = sub.add_parser(
        "replay", help="send a message again, even a delivered one, under its messageId"
    )
    common(replay)
    replay.add_argument("--source", required=True)
    replay.add_argument("--message-id", required=True)
    replay.add_argument("--destination", help="only this one (default: every one it went to)")
    replay.set_defaults(func=_operator_command(_replay))

    lanes = sub.add_parser(
        "lanes", help="per ordered destination: blocked lanes and the one blocked longest"
    )
    common(lanes)
    lanes.set_defaults(func=_operator_command(_lanes))

    discard = sub.add_parser(
        "discard",
        help="mark the pending deliveries of a destination no longer configured as discarded",
    )
    common(discard)
    discard.add_argument(
        "--destination", help="the destination, removed from the configuration (required)"
    )
    discard.add_argument("--since", help=f"messages received since: {when}")
    discard.add_argument("--until", help=f"messages received before: {when}")
    discard.add_argument(
        "--dry-run", action="store_true", help="count what would be discarded, change nothing"
    )
    discard.set_defaults(func=_operator_command(_discard))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="efd", description="Event-forwarding daemon")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run ingestion, delivery and housekeeping")
    serve.add_argument("--config", required=True, help="path of the TOML configuration")
    serve.set_defaults(func=cmd_serve)

    migrate = sub.add_parser("migrate", help="bring the database to the newest schema")
    migrate.add_argument("--config", required=True)
    migrate.set_defaults(func=cmd_migrate)

    check = sub.add_parser("check-config", help="validate a configuration and exit")
    check.add_argument("--config", required=True)
    check.set_defaults(func=cmd_check_config)

    audiences = sub.add_parser(
        "audiences", help="list audiences and computed traits, or preview what one selects"
    )
    audiences.add_argument("--config", required=True)
    audiences.add_argument(
        "--preview",
        metavar="NAME_OR_CONDITION",
        help="an audience or trait name, or a condition or expression, to evaluate now",
    )
    audiences.add_argument("--sample", type=int, default=10, help="profiles to show (preview)")
    audiences.set_defaults(func=cmd_audiences)

    listen = sub.add_parser(
        "listen",
        help="print the webhooks it receives, refusing those that do not verify (a test receiver)",
    )
    listen.add_argument("--host", default="127.0.0.1")
    listen.add_argument("--port", type=int, default=9000)
    listen.add_argument(
        "--secret",
        action="append",
        help="shared secret to verify X-Signature against (repeat for several: a rotation)",
    )
    listen.add_argument(
        "--status",
        type=int,
        default=200,
        help="HTTP status to answer with (requests that do not verify get 401)",
    )
    listen.add_argument(
        "--standard-webhooks-secret",
        action="append",
        metavar="WHSEC",
        help="whsec_ secret to verify webhook-signature against (repeat for several)",
    )
    listen.set_defaults(func=cmd_listen)

    receiver = sub.add_parser(
        "check-receiver",
        help="send a receiver signed test deliveries; exit 0 when it answers each as "
        "docs/delivery.md asks",
    )
    receiver.add_argument("url", metavar="URL", help="the receiver's URL (any address)")
    receiver.add_argument(
        "--secret",
        action="append",
        help="the X-Signature secret the receiver holds (repeat: a rotation, newest first)",
    )
    receiver.add_argument(
        "--standard-webhooks-secret",
        action="append",
        metavar="WHSEC",
        help="a whsec_ secret the receiver holds (repeat: a rotation, newest first)",
    )
    receiver.add_argument(
        "--timeout",
        type=float,
        default=config.DeliveryConfig().timeout_seconds,
        help="seconds for a complete answer, as delivery.timeout_seconds (default 5)",
    )
    receiver.add_argument("--ca-file", help="extra CA certificates (PEM) to trust")
    receiver.add_argument("--client-cert", help="a client certificate (PEM) to present")
    receiver.add_argument("--client-key", help="its private key, if not in --client-cert")
    receiver.set_defaults(func=cmd_check_receiver)

    key = sub.add_parser(
        "message-key",
        help="print messages.message_key (indexed on PostgreSQL) of a source's messageId",
    )
    key.add_argument("source", help="the source's name, as in the configuration")
    key.add_argument("message_id", metavar="MESSAGE_ID")
    key.set_defaults(func=cmd_message_key)

    _operator_parsers(sub)

    args = parser.parse_args(argv)
    try:
        result: int = args.func(args)
    except ClientError as error:  # what the admin API answers 4xx, printed: exit 2
        print(f"efd {args.command}: {error.message}", file=sys.stderr)
        return 2
    return result


if __name__ == "__main__":
    sys.exit(main())
