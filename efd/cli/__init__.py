"""The `efd` command: serve, migrate, check-config, audiences, listen, check-receiver,
message-key, map (an action's request for a message), and the operator's inspect,
deliveries, redrive, replay and discard."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from efd import __version__, config
from efd.cli import mapping, operators
from efd.cli.common import load_settings as _load
from efd.errors import ClientError
from efd.observe import logs
from efd.processes import collector

log = logging.getLogger("efd")


def _run_loop(coro: Coroutine[Any, Any, None]) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _load(args.config)  # a bad file is refused before the daemon's imports
    logs.setup(settings.logging.level, settings.logging.format)
    from efd.daemon import StartupError, run

    collector.tune()
    try:
        _run_loop(run(settings, config_path=args.config, ready=lambda _: collector.freeze()))
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

    from efd.segment.messages import format_timestamp

    return "never" if value is None else format_timestamp(datetime.fromtimestamp(value, UTC))


def cmd_audiences(args: argparse.Namespace) -> int:
    from efd.languages.audiences import ParseError
    from efd.personas.sync import AUDIENCE, TRAIT, Computation, preview
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
    from efd.segment.webhooks import standard_secret

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

    from efd.cli.check_receiver import check, report
    from efd.cli.receiver_check import Row, broker_kind, passed
    from efd.delivery import tls
    from efd.segment.webhooks import ClientCert, standard_secret

    def usage(problem: str) -> int:
        print(f"efd check-receiver: {problem}", file=sys.stderr)
        return 2

    parts = urlsplit(args.url)
    kind = broker_kind(args.url)
    if kind is None and args.key:
        return usage("--key is for a broker's URL (amqp://, nats://, redis://, mqtt://)")
    if kind is None and (parts.scheme not in ("http", "https") or not parts.hostname):
        return usage("the URL must be a full http:// or https:// URL, or a broker's")
    if kind is None and not (args.secret or args.standard_webhooks_secret):
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
    if kind is not None:
        return _check_broker(args, kind, keys, client)
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


def _check_broker(args: argparse.Namespace, kind: str, keys: list[bytes], client: Any) -> int:
    """check-receiver for a broker's URL: one test message published, the answer printed."""
    from efd.brokers.targets import BrokerConfigError, parse_target
    from efd.cli.check_receiver import broker_report, publish
    from efd.cli.receiver_check import broker_keys
    from efd.delivery.retry import AttemptResult, Verdict

    try:
        target = parse_target(kind, args.url, broker_keys(args.key or []))
    except BrokerConfigError as error:
        for problem in error.problems:
            print(
                f"efd check-receiver: {problem} (give the hook's keys with --key)", file=sys.stderr
            )
        return 2
    except ValueError as error:
        print(f"efd check-receiver: {error}", file=sys.stderr)
        return 2
    results: list[AttemptResult] = []

    async def run() -> None:
        results.append(
            await publish(
                target,
                args.secret or [],
                keys,
                timeout=args.timeout,
                user_agent=config.DeliveryConfig().user_agent,
                ca_file=args.ca_file,
                client=client,
            )
        )

    _run_loop(run())
    print(broker_report(target, results[0]))
    return 0 if results[0].verdict is Verdict.SUCCESS else 1


def cmd_message_key(args: argparse.Namespace) -> int:
    from efd.store.dedupe import message_key

    print(message_key(args.source, args.message_id))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="efd", description="Event-forwarding daemon")
    parser.add_argument("--version", action="version", version=f"efd {__version__}")
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
    receiver.add_argument(
        "--key",
        action="append",
        metavar="NAME=VALUE",
        help="a broker hook's key (routing_key, exchange, subject, stream, maxlen, topic, qos; "
        "repeat for several): the URL is then a broker's, and one test message is published",
    )
    receiver.set_defaults(func=cmd_check_receiver)

    key = sub.add_parser(
        "message-key",
        help="print messages.message_key (indexed on PostgreSQL) of a source's messageId",
    )
    key.add_argument("source", help="the source's name, as in the configuration")
    key.add_argument("message_id", metavar="MESSAGE_ID")
    key.set_defaults(func=cmd_message_key)

    operators.add_parsers(sub)
    mapping.add_parser(sub)

    args = parser.parse_args(argv)
    try:
        result: int = args.func(args)
    except ClientError as error:  # what the admin API answers 4xx, printed: exit 2
        print(f"efd {args.command}: {error.message}", file=sys.stderr)
        return 2
    return result


if __name__ == "__main__":
    sys.exit(main())
