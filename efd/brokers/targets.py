"""A broker hook's URL and keys, checked at load (pure: no I/O).

`parse_target` reads one hook of a broker destination: its URL (where efd connects, with which
credentials, over TLS or not) and the keys of its kind, and lists every problem as a
"key: reason" line for the configuration to prefix with the hook's path. A `Broker` is what
connections are shared by; it and a `Target` show their URL only redacted, as hook URLs are.
docs/brokers.md#keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import unquote, urlsplit

from efd.brokers.templates import Template, TemplateError, compile_template
from efd.delivery.netguard import numeric_host_problem
from efd.segment.webhooks import redact_url

AMQP: Final = "amqp"
NATS: Final = "nats"
REDIS_STREAMS: Final = "redis_streams"
MQTT: Final = "mqtt"
KINDS: Final = (AMQP, NATS, REDIS_STREAMS, MQTT)

# Each kind's schemes, the TLS one second, and their default ports.
SCHEMES: Final = {
    AMQP: ("amqp", "amqps"),
    NATS: ("nats", "tls"),
    REDIS_STREAMS: ("redis", "rediss"),
    MQTT: ("mqtt", "mqtts"),
}
DEFAULT_PORTS: Final = {
    "amqp": 5672,
    "amqps": 5671,
    "nats": 4222,
    "tls": 4222,
    "redis": 6379,
    "rediss": 6379,
    "mqtt": 1883,
    "mqtts": 8883,
}
# The keys of each kind's hooks beside `url` (and the hook keys every kind has, which the
# configuration reads itself), with their defaults.
KEYS: Final[dict[str, dict[str, Any]]] = {
    AMQP: {"exchange": "", "routing_key": None},
    NATS: {"subject": None},
    REDIS_STREAMS: {"stream": None, "maxlen": None},
    MQTT: {"topic": None, "qos": 1},
}
REQUIRED: Final = {AMQP: "routing_key", NATS: "subject", REDIS_STREAMS: "stream", MQTT: "topic"}
_EXCHANGE_CHARS: Final = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:"
)


class BrokerConfigError(ValueError):
    """A broker hook refused at load; `problems` holds one line per problem, "key: reason"."""

    def __init__(self, problems: list[str] | tuple[str, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True, slots=True)
class Broker:
    """One broker as efd connects to it: connections are shared by every hook whose Broker is
    equal (same kind, scheme, host, port, credentials, virtual host or database)."""

    kind: str
    tls: bool
    host: str  # as resolved and, for TLS, as the certificate must name it (IDNA, no brackets)
    port: int
    username: str | None = field(repr=False)
    password: str | None = field(repr=False)
    vhost: str  # AMQP's virtual host; "" for the other kinds
    database: int  # Redis' database; 0 for the other kinds
    label: str = field(compare=False)  # the URL redacted

    def __repr__(self) -> str:
        return f"Broker({self.label})"


@dataclass(frozen=True, slots=True)
class Target:
    """Where one hook publishes: the broker, the name (routing key, subject, stream, topic)
    and the kind's other keys."""

    url: str = field(repr=False)
    broker: Broker
    name: Template
    exchange: str = ""  # AMQP
    maxlen: int | None = None  # Redis Streams: approximate trimming
    qos: int = 1  # MQTT

    @property
    def kind(self) -> str:
        return self.broker.kind

    @property
    def label(self) -> str:
        return self.broker.label

    def __repr__(self) -> str:
        return f"Target({self.broker.label}, {self.name.source!r})"


def _url_problems(kind: str, url: Any) -> tuple[list[str], Broker | None]:
    schemes = SCHEMES[kind]
    wanted = f"must be a {schemes[0]}:// or {schemes[1]}:// URL"
    if not isinstance(url, str):
        return [f"url: {wanted}"], None
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        return [f"url: {wanted} (no spaces)"], None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return ["url: has an invalid port"], None
    if parts.scheme not in schemes:
        return [f"url: {wanted}"], None
    host = parts.hostname or ""
    if not host:
        return [f"url: {wanted} with a host"], None
    problems: list[str] = []
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        problems.append(
            "url: takes no query or fragment; the hook's settings are its keys, and TLS "
            "follows the scheme"
        )
    try:
        host = host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError:
        problems.append("url: the host is not a valid name")
    if problem := numeric_host_problem(host):
        problems.append(f"url: {problem}")
    username = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    path = parts.path
    vhost, database = "", 0
    if kind == AMQP:
        # The virtual host is the path's one segment, percent-decoded ("%2f" is "/"); none
        # is RabbitMQ's default, "/".
        if path.count("/") > 1:
            problems.append(
                "url: the path is the virtual host, one segment (write / inside it as %2f)"
            )
        vhost = unquote(path[1:]) if len(path) > 1 else "/"
    elif kind == REDIS_STREAMS:
        number = path[1:]
        if number and not (number.isascii() and number.isdigit() and len(number) <= 5):
            problems.append("url: the path is the database's number, as in redis://host:6379/0")
        else:
            database = int(number or "0")
        if username is not None and not username and password is None:
            problems.append("url: redis://:password@host is the form for a password alone")
    elif path not in ("", "/"):
        problems.append(f"url: a {parts.scheme}:// URL has no path")
    if kind == MQTT and username is None and password is not None:
        problems.append("url: a password needs a user name")
    if problems:
        return problems, None
    return [], Broker(
        kind=kind,
        tls=parts.scheme == schemes[1],
        host=host,
        port=port if port is not None else DEFAULT_PORTS[parts.scheme],
        username=username or None,
        password=password,
        vhost=vhost,
        database=database,
        label=redact_url(url),
    )


def _int_problem(key: str, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{key}: must be a whole number"
    return None


def parse_target(kind: str, url: Any, keys: Mapping[str, Any]) -> Target:
    """The target of a hook of a `kind` destination (one of KINDS); BrokerConfigError lists
    every problem. `keys` holds the hook's keys of its kind only (KEYS)."""
    if kind not in KEYS:
        raise BrokerConfigError([f"type: must be one of {', '.join(KINDS)}"])
    problems, broker = _url_problems(kind, url)
    known = KEYS[kind]
    for key in keys:
        if key not in known:
            others = ", ".join(["url", *known])
            problems.append(f"{key}: not a key of a {kind} hook (its keys: {others})")
    values = {**known, **{k: v for k, v in keys.items() if k in known}}
    required = REQUIRED[kind]
    name: Template | None = None
    if values[required] is None:
        problems.append(f"{required}: required for a {kind} hook")
    else:
        try:
            name = compile_template(kind, values[required])
        except TemplateError as error:
            problems += error.problems
    exchange = values.get("exchange", "")
    if kind == AMQP:
        if not isinstance(exchange, str):
            problems.append("exchange: must be a string")
        elif len(exchange) > 127 or not set(exchange) <= _EXCHANGE_CHARS:
            problems.append(
                "exchange: an exchange's name is at most 127 letters, digits, -, _, . and :"
                ' ("" is the default exchange)'
            )
    maxlen = values.get("maxlen")
    if kind == REDIS_STREAMS and maxlen is not None:
        if problem := _int_problem("maxlen", maxlen):
            problems.append(problem)
        elif maxlen < 1:
            problems.append("maxlen: must be at least 1 (leave it out to keep every entry)")
    qos = values.get("qos", 1)
    if kind == MQTT and (isinstance(qos, bool) or qos not in (1, 2)):
        problems.append(
            "qos: must be 1 (delivered on the broker's PUBACK) or 2 (on its PUBCOMP); "
            "0 has no acknowledgement"
        )
    if problems:
        raise BrokerConfigError(problems)
    assert broker is not None
    assert name is not None
    assert isinstance(url, str)
    return Target(
        url=url,
        broker=broker,
        name=name,
        exchange=exchange if kind == AMQP else "",
        maxlen=maxlen if kind == REDIS_STREAMS else None,
        qos=qos if kind == MQTT else 1,
    )
