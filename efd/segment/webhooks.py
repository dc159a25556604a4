"""The outbound webhook request: body, headers and signature (pure: no I/O)."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import unquote, unquote_plus, urlsplit, urlunsplit

from efd import jsonjs
from efd.segment.messages import Message, format_timestamp

SIGNATURE_HEADER = "X-Signature"
# Standard Webhooks (standardwebhooks.com): id, time and signature of each attempt.
WEBHOOK_ID = "webhook-id"
WEBHOOK_TIMESTAMP = "webhook-timestamp"
WEBHOOK_SIGNATURE = "webhook-signature"
WHSEC_PREFIX = "whsec_"


@dataclass(frozen=True, slots=True)
class ClientCert:
    """A hook's client certificate (mTLS): the PEM files efd presents, and a digest of their
    content when the configuration was loaded. A reload after the files were renewed makes
    another ClientCert, so the sender loads them again (efd/delivery/tls.py)."""

    cert: str
    key: str | None  # None: the private key is in the certificate's file
    digest: str

    def __repr__(self) -> str:
        return f"ClientCert({self.cert!r}, {self.key!r})"


@dataclass(frozen=True, slots=True)
class Route:
    """Where one destination's rounds go: its hook URLs with their static headers, and how
    they are signed (built from the configuration by DestinationConfig.route)."""

    name: str
    hooks: tuple[tuple[str, dict[str, str]], ...]  # (url, static headers)
    secret: str | None  # X-Signature's shared secret; None: no X-Signature
    user_agent: str
    # Standard Webhooks' keys, current first; empty: no webhook-* headers.
    standard_secrets: tuple[bytes, ...] = ()
    # Hook URL -> the client certificate presented to it; a hook not listed presents none.
    client_certs: Mapping[str, ClientCert] = field(default_factory=dict)
    # An action's request line and body type (efd/segment/actions.py); a webhook's are these.
    method: str = "POST"
    content_type: str = "application/json"
    # An action's route: one message makes a request per action, so its webhook-id names the
    # route too (webhook_id); a webhook destination's is the message's alone.
    action: bool = False
    # Each hook URL -> how efd names it in logs, the store and the APIs (hook_labels).
    labels: dict[str, str] = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", hook_labels(url for url, _ in self.hooks))

    def __repr__(self) -> str:  # never show the secret
        return f"Route({self.name!r}, {len(self.hooks)} hooks)"


# The webhook wire format's version, which the default User-Agent's product token carries
# (efd/1.0): it names the format receivers parse, not efd's release, so it stays put as efd's
# version moves (docs/decisions.md).
FORMAT_VERSION = "1.0"
DEFAULT_USER_AGENT = f"efd/{FORMAT_VERSION}"

# Headers efd owns, or that would change the request's framing or routing; a hook's static
# headers may not set them.
RESERVED_HEADERS = frozenset(
    {
        "content-type",
        "content-length",
        "transfer-encoding",
        "host",
        "connection",
        "user-agent",
        "x-signature",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    }
)

# RFC 9110 token characters: what a header name may be made of.
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def header_value_problem(value: str) -> str | None:
    """Why `value` cannot be sent as a header's value (a hook's or an action's static header,
    the User-Agent), or None."""
    if any(ch in value for ch in "\r\n\x00"):
        return "may not contain CR, LF or NUL"
    if any((ord(ch) < 0x20 and ch != "\t") or ord(ch) == 0x7F for ch in value):
        return "may not contain control characters"
    if not value.isascii():
        return "must be ASCII"
    return None


def body_for(message: Message) -> dict[str, Any]:
    """The JSON body of the webhook for one message (docs/delivery.md#body), before
    serialisation."""
    body: dict[str, Any] = {"version": 1, "type": message.type}
    fields = message.fields
    if message.type == "alias":
        # The spec's alias body names these two keys with spaces; the camelCase pair follows.
        body["Previous ID"] = fields["previousId"]
        body["User ID"] = message.user_id
        body["previousId"] = fields["previousId"]
    body["userId"] = message.user_id
    if message.anonymous_id is not None:
        body["anonymousId"] = message.anonymous_id
    body.update((k, v) for k, v in fields.items() if k != "previousId")
    if message.type == "screen":
        body["context"] = message.context or {}
    elif message.context is not None:
        body["context"] = message.context
    body["messageId"] = message.message_id
    body["timestamp"] = format_timestamp(message.timestamp)
    if message.original_timestamp is not None:  # timestamp is a clock-skew correction
        body["originalTimestamp"] = format_timestamp(message.original_timestamp)
    return body


def delete_body(user_id: str, timestamp: datetime) -> dict[str, Any]:
    """A delete notification carries exactly type, userId and timestamp."""
    return {"type": "delete", "userId": user_id, "timestamp": format_timestamp(timestamp)}


def encode(body: dict[str, Any], *, plain: bool = False) -> bytes:
    """The exact bytes sent and signed (JSON.stringify-compatible). `plain`: the values came
    from `jsonjs.loads_checked`, which found nothing Python writes differently.

    A lone surrogate (a client's "\\ud800" escape inside properties or traits) becomes
    U+FFFD: written as an escape, as JSON.stringify would, it is refused by strict JSON
    parsers (Rust's serde_json among them) and by UTF-8 databases downstream."""
    return jsonjs.dumps(body, plain=plain, replace_surrogates=True)


@functools.lru_cache(maxsize=256)
def _keyed(key: bytes, digest: str) -> hmac.HMAC:
    """An HMAC with its key already absorbed: a copy of it signs at about half the cost
    of keying a new one, and every round is signed with the same few keys."""
    return hmac.new(key, digestmod=digest)


def _mac(key: bytes, data: bytes, digest: str) -> bytes:
    mac = _keyed(key, digest).copy()
    mac.update(data)
    return mac.digest()


def sign(secret: str, body: bytes) -> str:
    """Hex HMAC-SHA1 of the exact body bytes, keyed by the shared secret."""
    return _mac(secret.encode("utf-8"), body, "sha1").hex()


def verify(secret: str, body: bytes, signature: str) -> bool:
    given = signature.strip().lower().encode("utf-8", "surrogateescape")
    return hmac.compare_digest(sign(secret, body).encode("ascii"), given)


def standard_secret(text: str) -> bytes:
    """The key of a Standard Webhooks secret, `whsec_` + base64 of 24 to 64 bytes; ValueError
    saying what is wrong."""
    if not text.startswith(WHSEC_PREFIX):
        raise ValueError(f"must start with {WHSEC_PREFIX}")
    encoded = text[len(WHSEC_PREFIX) :]
    try:
        key = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"must be {WHSEC_PREFIX} followed by standard base64") from None
    if not 24 <= len(key) <= 64:
        raise ValueError(f"must encode 24 to 64 bytes (this one has {len(key)})")
    return key


WEBHOOK_ID_PREFIX = "msg_"

# What a message's webhook-id is made of: its row id, source, messageId and receipt time.
MessageKey = tuple[int, str, str, float]


def webhook_id(
    message_pk: int, source: str, message_id: str, received_at: float, route: str | None = None
) -> str:
    """The webhook-id of a stored message: `msg_` and 26 base32 letters and digits (a 128-bit
    hash of the row's id, source, messageId and receipt time).

    Derived from the stored row, never written: the same on every retry and replay and
    after a restart, at no cost to ingestion. The messageId alone would repeat across
    sources (and after the 24-hour deduplication window), and a receiver that drops repeats
    would lose the second message; the row id alone can come back once the newest rows are
    deleted. Always ASCII, whatever the messageId: Node reads header bytes as Latin-1, so a
    UTF-8 id would not verify there. `route`: an action's route, whose request is another
    webhook than the other actions' requests for the same message."""
    key = f"{message_pk}\x00{source}\x00{message_id}\x00{float(received_at).hex()}"
    if route is not None:
        key += f"\x00{route}"
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    # base32 of the 128 bits (RFC 4648, lower case, unpadded), ten bits a lookup: computed
    # for every round, and base64.b32encode is pure Python.
    bits = int.from_bytes(digest, "big") << 2
    return WEBHOOK_ID_PREFIX + "".join([_B32_PAIRS[(bits >> s) & 1023] for s in _B32_SHIFTS])


_B32_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"
_B32_PAIRS = [a + b for a in _B32_ALPHABET for b in _B32_ALPHABET]
_B32_SHIFTS = range(120, -1, -10)


def route_webhook_id(route: Route, message: MessageKey) -> str:
    """The webhook-id of a message's request on `route`."""
    return webhook_id(*message, route=route.name if route.action else None)


def standard_signature(keys: Sequence[bytes], webhook_id: str, timestamp: int, body: bytes) -> str:
    """webhook-signature: `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">` for each key,
    space-separated, so receivers holding any one of them verify (key rotation)."""
    signed = b"%s.%d.%s" % (webhook_id.encode(), timestamp, body)
    return " ".join("v1," + base64.b64encode(_mac(key, signed, "sha256")).decode() for key in keys)


def request_headers(
    *,
    user_agent: str,
    secret: str | None,
    body: bytes,
    static: Mapping[str, str],
    webhook_id: str = "",
    timestamp: int = 0,
    standard_secrets: Sequence[bytes] = (),
    content_type: str = "application/json",
) -> dict[str, str]:
    """The headers of one attempt: efd's own over the hook's static ones; the body's
    `content_type` (an action's may be a form); webhook-id (the receivers' deduplication
    key, whatever the signing) when there is one; X-Signature when there is a shared
    secret; webhook-timestamp and webhook-signature when there are Standard Webhooks keys."""
    headers = dict(static)
    headers["User-Agent"] = user_agent
    headers["Content-Type"] = content_type
    if webhook_id:
        headers[WEBHOOK_ID] = webhook_id
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, body)
    if standard_secrets:
        headers[WEBHOOK_TIMESTAMP] = str(timestamp)
        headers[WEBHOOK_SIGNATURE] = standard_signature(
            standard_secrets, webhook_id, timestamp, body
        )
    return headers


@functools.lru_cache(maxsize=1024)
def redact_url(url: str) -> str:
    """The URL with credentials and query values hidden, for logs and the attempts table."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port is not None:
        netloc += f":{parts.port}"
    if ":" in (parts.hostname or ""):
        netloc = f"[{parts.hostname}]" + (f":{parts.port}" if parts.port is not None else "")
    if parts.username or parts.password:
        netloc = "***@" + netloc
    query = "&".join(
        f"{pair.split('=', 1)[0]}=***" if "=" in pair else pair
        for pair in parts.query.split("&")
        if pair
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def hook_labels(urls: Iterable[str]) -> dict[str, str]:
    """url -> how efd names that hook of one destination wherever it writes or shows it (logs,
    `failed_hooks`, `last_error`, the attempts table, the admin API): the redacted URL. Hooks
    that differ only in what redaction hides would read alike, so the second and later of
    them, in the configuration's order, get " #2", " #3"... (a URL holds no space)."""
    labels: dict[str, str] = {}
    seen: Counter[str] = Counter()
    for url in urls:
        if url in labels:
            continue
        redacted = redact_url(url)
        seen[redacted] += 1
        labels[url] = redacted if seen[redacted] == 1 else f"{redacted} #{seen[redacted]}"
    return labels


def failed_labels(route: Route, stored: Collection[str]) -> frozenset[str]:
    """A delivery's `failed_hooks` as labels of `route`'s hooks. Rows written before hooks
    were stored by label name them by URL; an entry that names no configured hook is kept
    only when it reveals nothing, so the next outcome written drops raw URLs."""
    if not stored:  # the common case, on every round's start
        return frozenset()
    labels = route.labels
    known = set(labels.values())
    failed = set()
    for entry in stored:
        if entry in known:
            failed.add(entry)
        elif entry in labels:
            failed.add(labels[entry])
        elif _redacted(entry) == entry:
            failed.add(entry)
    return frozenset(failed)


# A URL inside some text: a scheme, "://", then everything up to a space or a quote.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
_MIN_BARE_SECRET = 6  # a shorter value alone would hide ordinary words in the text


def _redacted(url: str) -> str:
    try:
        return redact_url(url)
    except ValueError:  # not a URL urlsplit can read (a bad port, say): hide all of it
        return url.split("://", 1)[0] + "://***"


def redact_urls(text: str) -> str:
    """`text` with every URL in it redacted as redact_url does."""
    return _URL_IN_TEXT.sub(lambda match: _redacted(match.group()), text)


@functools.lru_cache(maxsize=1024)
def _secrets(url: str) -> tuple[tuple[str, str], ...]:
    """(text, replacement) for each form in which `url`'s credentials and query values could
    appear in an error or an answer, longest first; empty when redaction hides nothing."""
    parts = urlsplit(url)
    found: dict[str, str] = {}
    userinfo = parts.netloc.rpartition("@")[0]
    if userinfo:
        for form in (userinfo, unquote(userinfo)):
            found[form] = "***"
        for piece in userinfo.split(":"):
            for form in (piece, unquote(piece)):
                if len(form) >= _MIN_BARE_SECRET:
                    found[form] = "***"
    for pair in parts.query.split("&"):
        name, equals, value = pair.partition("=")
        if not equals or not value:
            continue
        for form in (value, unquote(value), unquote_plus(value)):
            found[f"{name}={form}"] = f"{name}=***"
            if len(form) >= _MIN_BARE_SECRET:
                found[form] = "***"
    return tuple(sorted(found.items(), key=lambda item: len(item[0]), reverse=True))


def scrub(text: str, url: str) -> str:
    """`text` (an error, a receiver's answer) from a POST to `url`, with every URL in it
    redacted and `url`'s credentials and query values hidden wherever they appear, and any
    NUL (a binary answer; PostgreSQL's text cannot hold it) shown as U+FFFD."""
    text = text.replace("\x00", "\ufffd")
    secrets = _secrets(url)
    if not secrets:
        return text
    text = redact_urls(text)
    for secret, replacement in secrets:
        text = text.replace(secret, replacement)
    return text
