"""The operator's commands (inspect, deliveries, lanes, redrive, replay, discard, pause,
resume): the rules of efd/operations/selection.py and pauses.py, on the database directly,
as the admin API applies them."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from efd import config
from efd.cli.common import load_settings as _load


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


def _operator_command(run: Any, *, with_store: bool = False) -> Any:
    """Runs `run(args, settings, operations)` (and the store, `with_store`): an unreachable
    store exits 1 (bad arguments exit 2, by main)."""

    def command(args: argparse.Namespace) -> int:
        from efd.errors import StoreError

        settings, store, operations = _operations(args)
        args.pauses = store.pauses  # the tables note the pauses of the destinations they show
        try:
            extra = (store,) if with_store else ()
            code: int = run(args, settings, operations, *extra)
            return code
        except StoreError as error:
            print(f"efd {args.command}: the store is unavailable: {error}", file=sys.stderr)
            return 1
        finally:
            store.dispose()

    return command


def _pause_command(run: Any) -> Any:
    """Runs `run(args, settings, store)` for `efd pause` and `efd resume`: bad arguments
    (an unknown destination or hook) exit 2, an unreachable store 1."""

    def command(args: argparse.Namespace) -> int:
        from efd.errors import ClientError, StoreError

        settings, store, _ = _operations(args)
        try:
            code: int = run(args, settings, store)
            return code
        except ClientError as error:
            print(f"efd {args.command}: {error.message}", file=sys.stderr)
            return 2
        except StoreError as error:
            print(f"efd {args.command}: the store is unavailable: {error}", file=sys.stderr)
            return 1
        finally:
            store.dispose()

    return command


def _paused_notes(
    args: argparse.Namespace, settings: config.Settings, shown: set[str]
) -> list[str]:
    """A line per pause or disable of a destination in `shown` (route names, as deliveries
    name them), for the tables of `efd deliveries` and `efd inspect`."""
    from efd.delivery.pausing import Pause, target_name
    from efd.operations.pauses import describe

    owners = {name: d.name for d in settings.destinations for name in (d.name, *d.route_names())}
    wanted = {owners[name] for name in shown if name in owners}
    rows = [Pause(*row) for row in args.pauses.all()]
    return [
        f"{target_name(p.destination, p.hook)}: {describe(p)}"
        for p in rows
        if p.destination in wanted
    ]


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def _short(value: str | None, width: int) -> str:
    text = "-" if value is None else value
    return text if len(text) <= width else text[: width - 1] + "…"


def _inspect(
    args: argparse.Namespace, settings: config.Settings, operations: Any, store: Any
) -> int:
    from efd.delivery.lanes import waiting_note
    from efd.operations.selection import attempt_json, message_json

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
    # A batched action's delivery: the batch that carried it (docs/actions.md#batches).
    carried = store.batches.carried([d["id"] for d in shown["deliveries"]])
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
        if d["url"]:
            print(f"  url {d['url']}")
        if d["status"] == "failed" and not d["attemptCount"] and d["lastError"]:
            print(f"  failed at routing, never sent: {d['lastError']}")
            continue
        if d["nextAttemptAt"]:
            print(f"  next attempt {d['nextAttemptAt']}")
        if d["status"] == "queued":
            print(f"  {waiting_note(d['waitingFor'])}")
        print(f"  retry window ends {d['windowEndsAt']}")
        attempts = d["attempts"]
        batch = carried.get(d["id"])
        if batch is not None:
            print(
                f"  in batch {batch.batch_id} (webhook-id {batch.webhook_id}): "
                f"{batch.size} events, {batch.status}"
            )
            # The batch's requests are its every event's: one attempt row each names only
            # its first event.
            attempts = [attempt_json(a) for a in batch.attempts]
        if not attempts:
            print("  no attempts yet")
        for a in attempts:
            result = str(a["statusCode"]) if a["statusCode"] is not None else a["error"]
            duration = f"{a['durationMs']:.1f} ms" if a["durationMs"] is not None else "-"
            print(f"  {a['at']}  {a['url']}  {result}  {duration}")
            if a["statusCode"] is not None and a["error"]:
                print(f"    error: {a['error']}")
            if a["response"]:
                print(f"    response: {_short(' '.join(a['response'].split()), 100)}")
    for note in _paused_notes(args, settings, {d["destination"] for d in shown["deliveries"]}):
        print(note)
    return 0


def _given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The named options the command line set, keyed as the admin API's filters are."""
    return {name: value for name in names if (value := getattr(args, name)) is not None}


def _deliveries(args: argparse.Namespace, settings: config.Settings, operations: Any) -> int:
    import time

    from efd.operations.selection import list_query, page_json

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
    for note in _paused_notes(args, settings, {d["destination"] for d in page["deliveries"]}):
        print(note)
    return 0


def _redrive(args: argparse.Namespace, settings: config.Settings, operations: Any) -> int:
    import time

    from efd.operations.selection import redrive_query

    query, dry_run = redrive_query(
        _given(args, "destination", "status", "since", "until", "dry_run"),
        time.time(),
        settings.route_names(),
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
    from efd.operations.selection import lanes_json

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
        count = lanes["blocked"]
        line = f"{name}: {count} blocked lane{'' if count == 1 else 's'}"
        if count:
            line += (
                f"; blocked longest: message {lanes['oldestBlockedMessageId']}, "
                f"since {lanes['oldestBlockedSince']}"
            )
        print(line)
    return 0


def _discard(args: argparse.Namespace, settings: config.Settings, operations: Any) -> int:
    import time

    from efd.operations.selection import DISCARD_CHUNK, discard_query

    query, dry_run = discard_query(
        _given(args, "destination", "since", "until", "dry_run"),
        time.time(),
        settings.route_names(),
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

    from efd.operations.selection import replay_json, replay_targets

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
    targets = replay_targets(originals, args.destination, settings.route_names())
    created = operations.replay(pk, targets, time.time())
    if created is None:
        print(
            f"efd replay: no message {args.message_id!r} from source {args.source!r} is stored",
            file=sys.stderr,
        )
        return 1
    ordered = settings.ordered()
    if args.json:
        _print_json(replay_json(created, ordered))
    else:
        for delivery_id, name in created:
            late = ", out of order: not through its lane" if name in ordered else ""
            print(f"delivery {delivery_id} to {name}: a replay of what routing made of it{late}")
    return 0


def _pause(args: argparse.Namespace, settings: config.Settings, store: Any) -> int:
    import time

    from efd.delivery.pausing import Pause
    from efd.http.admin import numbered_hooks
    from efd.operations.events import BY_COMMAND_LINE, hook_paused
    from efd.operations.pauses import describe, pause_json, target

    counts = {d: len(h) for d, h in numbered_hooks(settings).items()}
    given = _given(args, "hook", "reason")
    destination, hook, reason = target(args.destination, given, counts)
    row = Pause(*store.pauses.pause(destination, hook, reason, time.time()))
    _tell(
        store,
        settings,
        hook_paused(
            destination,
            hook,
            reason=row.reason,
            since=row.since,
            by=BY_COMMAND_LINE,
            at=time.time(),
        ),
    )
    if args.json:
        _print_json({"pause": pause_json(row)})
    else:
        what = destination if hook is None else f"hook {hook} of {destination}"
        print(f"{what}: {describe(row)}; a running daemon applies it within a second")
    return 0


def _resume(args: argparse.Namespace, settings: config.Settings, store: Any) -> int:
    import time

    from efd.delivery.pausing import Pause
    from efd.http.admin import numbered_hooks
    from efd.operations.events import BY_COMMAND_LINE, hook_resumed
    from efd.operations.pauses import pause_json, target

    numbered = numbered_hooks(settings)
    counts = {d: len(h) for d, h in numbered.items()}
    destination, hook, _ = target(args.destination, _given(args, "hook"), counts, resume=True)
    routes = list(dict.fromkeys(name for name, _ in numbered[destination]))
    found, due = store.pauses.resume(destination, hook, routes, time.time())
    if found is not None:
        lifted = Pause(*found)
        _tell(
            store,
            settings,
            hook_resumed(
                destination,
                hook,
                was=lifted.kind,
                since=lifted.since,
                due=due,
                by=BY_COMMAND_LINE,
                at=time.time(),
            ),
        )
    if args.json:
        _print_json({"resumed": None if found is None else pause_json(Pause(*found)), "due": due})
        return 0
    what = destination if hook is None else f"hook {hook} of {destination}"
    if found is None:
        print(f"{what} was not paused or disabled: nothing changed")
    else:
        print(f"{what} is resumed (it was {found[2]}); deliveries due now: {due}")
    return 0


def _tell(store: Any, settings: config.Settings, event: Any) -> None:
    """Store the operational event for [operations]'s destination, as the daemon would: a
    running daemon delivers it (on SQLite within a second, on PostgreSQL at once)."""
    import time

    from efd.services.notices import store_now

    store_now(store, settings, event, time.time())


def _hook_number(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None


def add_parsers(sub: Any) -> None:
    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--config", required=True, help="path of the TOML configuration")
        parser.add_argument("--json", action="store_true", help="print JSON")

    when = "ISO 8601, or relative: 2h, 30m, 1d ago"
    inspect = sub.add_parser("inspect", help="a message: its body, deliveries and every attempt")
    common(inspect)
    inspect.add_argument("--source", required=True)
    inspect.add_argument("--message-id", required=True)
    inspect.set_defaults(func=_operator_command(_inspect, with_store=True))

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

    pause = sub.add_parser(
        "pause", help="send a destination, or one of its hooks, nothing until resumed"
    )
    common(pause)
    pause.add_argument("destination", help="a configured destination")
    pause.add_argument(
        "--hook",
        type=_hook_number,
        help="only this hook: its position in the configuration, from 1",
    )
    pause.add_argument("--reason", help="why, shown wherever the pause is")
    pause.set_defaults(func=_pause_command(_pause))

    resume = sub.add_parser("resume", help="send to a paused or disabled destination or hook again")
    common(resume)
    resume.add_argument("destination", help="a configured destination")
    resume.add_argument("--hook", type=_hook_number, help="the hook, as it was paused")
    resume.set_defaults(func=_pause_command(_resume))
