"""The `efd` command: serve, migrate, check-config, audiences, listen, message-key."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Coroutine, Sequence
from typing import Any

from efd import config, logs

log = logging.getLogger("efd")


def _load(path: str) -> config.Settings:
    try:
        return config.load(path)
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
    from efd.app import StartupError, run

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

    from efd.messages import format_timestamp

    return "never" if value is None else format_timestamp(datetime.fromtimestamp(value, UTC))


def cmd_audiences(args: argparse.Namespace) -> int:
    from efd.audiences import ParseError
    from efd.periodic import computations
    from efd.personas.sync import AUDIENCE, TRAIT, Computation, preview
    from efd.store import Store, migrate
    from efd.store.computations import ComputationsStore
    from efd.store.regulations import Suppressions

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
    from efd.listen import serve
    from efd.webhooks import standard_secret

    for secret in args.standard_webhooks_secret or []:
        try:
            standard_secret(secret)
        except ValueError as error:
            print(f"efd listen: --standard-webhooks-secret {error}", file=sys.stderr)
            return 2
    _run_loop(serve(args.host, args.port, args.secret, args.status, args.standard_webhooks_secret))
    return 0


def cmd_message_key(args: argparse.Namespace) -> int:
    from efd.store.dedupe import message_key

    print(message_key(args.source, args.message_id))
    return 0


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

    listen = sub.add_parser("listen", help="print the webhooks it receives (a test receiver)")
    listen.add_argument("--host", default="127.0.0.1")
    listen.add_argument("--port", type=int, default=9000)
    listen.add_argument("--secret", help="shared secret to verify X-Signature against")
    listen.add_argument("--status", type=int, default=200, help="HTTP status to answer with")
    listen.add_argument(
        "--standard-webhooks-secret",
        action="append",
        metavar="WHSEC",
        help="whsec_ secret to verify webhook-signature against (repeat for several)",
    )
    listen.set_defaults(func=cmd_listen)

    key = sub.add_parser(
        "message-key",
        help="print messages.message_key (indexed on PostgreSQL) of a source's messageId",
    )
    key.add_argument("source", help="the source's name, as in the configuration")
    key.add_argument("message_id", metavar="MESSAGE_ID")
    key.set_defaults(func=cmd_message_key)

    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
