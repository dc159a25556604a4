"""The `efd` command: serve, migrate, check-config, listen."""

from __future__ import annotations

import argparse
import asyncio
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
        _run_loop(run(settings))
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
    print(
        f"{args.config}: OK ({len(settings.sources)} sources, "
        f"{len(settings.destinations)} destinations)"
    )
    return 0


def cmd_listen(args: argparse.Namespace) -> int:
    from efd.listen import serve

    _run_loop(serve(args.host, args.port, args.secret, args.status))
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

    listen = sub.add_parser("listen", help="print the webhooks it receives (a test receiver)")
    listen.add_argument("--host", default="127.0.0.1")
    listen.add_argument("--port", type=int, default=9000)
    listen.add_argument("--secret", help="shared secret to verify X-Signature against")
    listen.add_argument("--status", type=int, default=200, help="HTTP status to answer with")
    listen.set_defaults(func=cmd_listen)

    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
