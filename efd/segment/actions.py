"""One action's request: its URL, method, headers and body, checked at load and rendered for
a message and its mapped value (pure: no I/O).

`compile_request` checks an action's `url`, `method`, `headers` and `content_type` and names
every problem by its key from the action; `render` turns the compiled request, the message
(for the URL's `{{field}}` templates) and the mapped value (the body) into the method, URL,
headers and body bytes the sender sends. The reference is docs/actions.md#requests.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote

import yarl

from efd import jsonjs
from efd.languages.mapping import template
from efd.languages.mapping.values import UNDEFINED, get, js_string
from efd.segment.messages import MAX_MESSAGE_BYTES
from efd.segment.webhooks import HEADER_NAME, RESERVED_HEADERS, header_value_problem

METHODS: Final = ("POST", "PUT", "PATCH")
JSON: Final = "application/json"
FORM: Final = "application/x-www-form-urlencoded"
CONTENT_TYPES: Final = (JSON, FORM)

# Hop-by-hop headers: they describe one connection, which efd owns.
_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_PLACEMENT: Final = (
    "a template may stand only in the path or query, never in the scheme, host or port "
    "(a message must not choose where efd connects)"
)
# The literal text before the first template must hold the scheme and the whole authority.
_AUTHORITY: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^/?#]*[/?#]")
_TEMPLATE: Final = re.compile(r"\{\{([^{}]*)\}\}")
_LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")


class ActionRequestError(ValueError):
    """An action's request refused at load, or one that cannot be rendered for a message.
    `problems` holds one line per problem, each "key.path: reason"."""

    def __init__(self, problems: list[str] | tuple[str, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class _Field:
    """A `{{path}}` in the URL's path or query, and the keys it reads."""

    source: str
    keys: tuple[str, ...]


@dataclass(frozen=True)
class ActionRequest:
    """A compiled action request. `url` is as configured; `parts` is its literal text and
    its templates in order; `origin` the scheme, host, port and userinfo every rendered URL
    keeps."""

    url: str
    method: str
    headers: tuple[tuple[str, str], ...]
    content_type: str
    parts: tuple[str | _Field, ...]
    origin: tuple[str, str, int | None, str]
    # The URL of every message when `url` holds no template, rendered once.
    fixed_url: str | None = None

    def render(self, message: Any, value: Any, *, plain: bool = False) -> Request:
        return render(self, message, value, plain=plain)


@dataclass(frozen=True)
class Request:
    """What is sent for one message: efd's own headers (User-Agent, signatures) are the
    sender's to add."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes


def _origin(url: yarl.URL) -> tuple[str, str, int | None, str]:
    """What the sender connects to and authenticates with: scheme, host, port, userinfo."""
    return (url.scheme, url.raw_host or "", url.port, f"{url.raw_user}:{url.raw_password}")


def _url_problems(
    url: str, url_problem: Callable[[str], str | None]
) -> tuple[list[str], tuple[str | _Field, ...], tuple[str, str, int | None, str] | None]:
    problems: list[str] = []
    parts: list[str | _Field] = []
    skeleton = ""  # the URL with each template standing for one letter
    literal = ""  # the literal text so far: where the next template stands
    position = 0
    misplaced = False
    for match in _TEMPLATE.finditer(url):
        parts.append(url[position : match.start()])
        literal += url[position : match.start()]
        skeleton += url[position : match.start()] + "x"
        position = match.end()
        source = match.group(0)
        if _AUTHORITY.match(literal) is None:
            problems.append(f"url: {source}: {_PLACEMENT}")
            misplaced = True
        elif "#" in literal:
            problems.append(
                f"url: {source}: a template may stand only in the path or query, not in the "
                "fragment, which is never sent"
            )
        elif isinstance(keys := template.field(source, match.group(1), "userId"), str):
            problems.append(f"url: {keys}")
        else:
            parts.append(_Field(source, keys))
    parts.append(url[position:])
    literal += url[position:]
    skeleton += url[position:]
    if "{" in literal or "}" in literal:
        problems.append(
            "url: { and } stand only in {{field}} templates: a {{ without its }}, or a "
            "brace in a path (write it as %7B or %7D)"
        )
    if misplaced:  # the authority is not known, and what it would be is refused already
        return problems, (), None
    # The rule for every URL efd sends to, on the URL with each template one letter.
    problem = url_problem(skeleton)
    if problem is not None:
        problems.append(f"url: {problem}")
        return problems, (), None
    try:
        origin = _origin(yarl.URL(skeleton))
    except ValueError:
        problems.append("url: must be a full http:// or https:// URL")
        return problems, (), None
    return problems, tuple(part for part in parts if part != ""), origin


def _headers_problems(headers: Any) -> tuple[list[str], tuple[tuple[str, str], ...]]:
    if headers is None:
        return [], ()
    if not isinstance(headers, Mapping):
        return ["headers: must be a table of header names and their values"], ()
    problems: list[str] = []
    seen: dict[str, str] = {}
    for name, value in headers.items():
        key = f"headers.{name}"
        folded = str(name).strip().lower()
        if folded == "content-type":
            problems.append(f"{key}: set by efd from content_type")
        elif folded in _HOP_BY_HOP:
            problems.append(f"{key}: a hop-by-hop header, which efd's connection sets")
        elif folded in RESERVED_HEADERS:
            problems.append(f"{key}: set by efd")
        elif not isinstance(name, str) or not HEADER_NAME.fullmatch(name):
            problems.append(f"{key}: not a valid header name")
        elif folded in seen:
            problems.append(f"{key}: the same header as {seen[folded]} (names ignore case)")
        else:
            seen[folded] = name
            if not isinstance(value, str):
                problems.append(f"{key}: the value must be a string")
            elif (problem := header_value_problem(value)) is not None:
                problems.append(f"{key}: the value {problem}")
    if problems:
        return problems, ()
    return [], tuple(headers.items())


def compile_request(
    *,
    url: Any,
    method: Any = "POST",
    headers: Any = None,
    content_type: Any = JSON,
    url_problem: Callable[[str], str | None],
) -> ActionRequest:
    """Check an action's request keys; ActionRequestError lists every problem, each naming
    its key. `url_problem` is the rule for any URL efd sends to, netguard.http_url_problem,
    which efd.segment, below efd.delivery, is handed rather than imports."""
    problems: list[str] = []
    if not isinstance(url, str):
        problems.append("url: must be a full http:// or https:// URL")
        parts: tuple[str | _Field, ...] = ()
        origin = None
    else:
        url_problems, parts, origin = _url_problems(url, url_problem)
        problems += url_problems
    if method not in METHODS:
        problems.append("method: must be POST, PUT or PATCH")
    header_problems, header_pairs = _headers_problems(headers)
    problems += header_problems
    if content_type not in CONTENT_TYPES:
        problems.append(f'content_type: must be "{JSON}" or "{FORM}"')
    if problems:
        raise ActionRequestError(problems)
    assert origin is not None
    request = ActionRequest(url, method, header_pairs, content_type, parts, origin)
    if not any(isinstance(part, _Field) for part in parts):
        request = dataclasses.replace(request, fixed_url=render_url(request, {}))
    return request


# -- rendering

_URL_SAFE: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
# WHATWG's application/x-www-form-urlencoded percent-encode set leaves these (and makes a
# space "+").
_FORM_SAFE: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789*-._")
_URL_BYTES: Final = tuple(chr(b) if b in _URL_SAFE else f"%{b:02X}" for b in range(256))
_FORM_BYTES: Final = tuple(
    "+" if b == 0x20 else chr(b) if b in _FORM_SAFE else f"%{b:02X}" for b in range(256)
)


def _utf8(text: str) -> bytes:
    """UTF-8, a lone surrogate as U+FFFD (as a URL or a form reads text)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", text).encode("utf-8")


def _percent(text: str, table: tuple[str, ...]) -> str:
    return "".join([table[b] for b in _utf8(text)])


def _field_text(field: _Field, message: Any) -> str:
    value = get(message, field.keys)
    return "" if value is None or value is UNDEFINED else js_string(value)


def _render_url(request: ActionRequest, message: Any) -> str:
    out: list[str] = []
    # The path's current segment, and whether a field's value is in it.
    segment, valued, in_query = "", False, False
    for part in request.parts:
        if isinstance(part, _Field):
            encoded = _percent(_field_text(part, message), _URL_BYTES)
            if not in_query:
                segment, valued = segment + encoded, True
            out.append(encoded)
            continue
        out.append(part)
        if in_query:
            continue
        cut = next((i for i, ch in enumerate(part) if ch in "?#"), len(part))
        first, *others = part[:cut].split("/")
        segment += first
        for piece in others:
            _check_segment(segment, valued)
            segment, valued = piece, False
        if cut < len(part):
            _check_segment(segment, valued)
            in_query = True
    if not in_query:
        _check_segment(segment, valued)
    return "".join(out)


def _check_segment(segment: str, valued: bool) -> None:
    if valued and unquote(segment) in (".", ".."):
        raise ActionRequestError(
            [f'url: a field makes the path segment "{segment}", which would change the path']
        )


def render_url(request: ActionRequest, message: Any) -> str:
    """The URL for a message: each `{{field}}` percent-encoded (all but letters, digits and
    `-._~`), as the sender reads it; ActionRequestError if a value would change the path's
    shape or where efd connects."""
    text = _render_url(request, message)
    try:
        url = yarl.URL(text)
        same = _origin(url) == request.origin
    except ValueError:
        same = False
    if not same:  # cannot happen with the encoding above: the last guard of the origin
        raise ActionRequestError(
            ["url: the rendered URL would not go to the configured scheme, host and port"]
        )
    return str(url)


def _form_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return jsonjs.dumps(value, replace_surrogates=True).decode("utf-8")


def form_body(value: Any) -> bytes:
    """An object as application/x-www-form-urlencoded, as WHATWG's serializer writes it:
    a string as it is, null as nothing, any other value as its JSON."""
    if not isinstance(value, dict):
        kind = "an array" if isinstance(value, list) else "not an object"
        raise ActionRequestError(
            [f"data: a form body is made of an object's keys, and the mapped value is {kind}"]
        )
    pairs = (
        _percent(str(key), _FORM_BYTES) + "=" + _percent(_form_value(value[key]), _FORM_BYTES)
        for key in jsonjs.js_key_order(value)
    )
    return "&".join(pairs).encode("ascii")


def render(request: ActionRequest, message: Any, value: Any, *, plain: bool = False) -> Request:
    """The request for one message and its mapped value; raises only ActionRequestError.
    `plain`: the value is plain (efd.jsonjs), written as it is."""
    url = request.fixed_url or render_url(request, message)
    try:
        if request.content_type == FORM:
            body = form_body(value)
        else:
            body = jsonjs.dumps(value, plain=plain, replace_surrogates=True)
    except (TypeError, ValueError, RecursionError) as error:
        if isinstance(error, ActionRequestError):
            raise
        raise ActionRequestError(["data: the mapped value cannot be written as JSON"]) from None
    if len(body) > MAX_MESSAGE_BYTES:  # what any delivery may carry, as a message's body
        raise ActionRequestError(
            [
                f"data: the mapped body is {len(body)} bytes; a delivery carries at most "
                f"{MAX_MESSAGE_BYTES}"
            ]
        )
    headers = dict(request.headers)
    headers["Content-Type"] = request.content_type
    return Request(request.method, url, headers, body)
