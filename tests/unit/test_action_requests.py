"""An action's request (efd/segment/actions.py): every problem its keys are refused for at
load, URLs rendered from templates byte by byte and read back as the sender reads them, the
JSON and form bodies, the headers, and a fuzz that no message moves a request to another
host or makes rendering raise anything but ActionRequestError."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efd.delivery import netguard
from efd.delivery.http1 import parse_target
from efd.segment.actions import (
    FORM,
    JSON,
    ActionRequest,
    ActionRequestError,
    Request,
    compile_request,
    render,
    render_url,
)
from efd.segment.messages import MAX_MESSAGE_BYTES


def checked(**keys: Any) -> ActionRequest:
    """An action's request compiled as the configuration compiles it."""
    return compile_request(url_problem=netguard.http_url_problem, **keys)


PLACEMENT = (
    "a template may stand only in the path or query, never in the scheme, host or port "
    "(a message must not choose where efd connects)"
)


def refusal(**keys: Any) -> list[str]:
    with pytest.raises(ActionRequestError) as caught:
        checked(**keys)
    return list(caught.value.problems)


def sent(url: str, message: Any, value: Any = None, **keys: Any) -> Request:
    return render(checked(url=url, **keys), message, {} if value is None else value)


# -- load


@pytest.mark.parametrize(
    ("keys", "problem"),
    [
        ({"url": "ftp://h.example/x"}, "url: must be a full http:// or https:// URL"),
        ({"url": "https:///x"}, "url: must be a full http:// or https:// URL"),
        ({"url": "h.example/x"}, "url: must be a full http:// or https:// URL"),
        ({"url": 5}, "url: must be a full http:// or https:// URL"),
        (
            {"url": "https://h.example/a b"},
            "url: must be a full http:// or https:// URL (no spaces)",
        ),
        (
            {"url": "https://h.example/a\nb"},
            "url: must be a full http:// or https:// URL (no spaces)",
        ),
        ({"url": "https://h.example:99999/"}, "url: has an invalid port"),
        ({"url": "https://h.example:{{p}}/"}, f"url: {{{{p}}}}: {PLACEMENT}"),
        ({"url": "https://h.example{{p}}"}, f"url: {{{{p}}}}: {PLACEMENT}"),
        ({"url": "https://u:{{pw}}@h.example/"}, f"url: {{{{pw}}}}: {PLACEMENT}"),
        (
            {"url": "https://h.example/a#{{x}}"},
            "url: {{x}}: a template may stand only in the path or query, not in the "
            "fragment, which is never sent",
        ),
        (
            {"url": "https://h.example/{{}}"},
            "url: {{}} names no field; write its path, as in {{userId}}",
        ),
        (
            {"url": "https://h.example/{{ }}"},
            "url: {{ }} names no field; write its path, as in {{userId}}",
        ),
        (
            {"url": "https://h.example/{{$.traits.email}}"},
            "url: {{$.traits.email}}: a template's path starts at the message, without $ "
            "(as in @template): {{traits.email}}",
        ),
        (
            {"url": "https://h.example/{{.}}"},
            "url: {{.}} names the whole message; name one of its fields",
        ),
        (
            {"url": "https://h.example/{{a\tb}}"},
            "url: {{a\tb}}: a field's path may not hold control characters",
        ),
        (
            {"url": "https://h.example/{{userId"},
            "url: { and } stand only in {{field}} templates: a {{ without its }}, or a brace "
            "in a path (write it as %7B or %7D)",
        ),
        (
            {"url": "https://h.example/{{{userId}}}"},
            "url: { and } stand only in {{field}} templates: a {{ without its }}, or a brace "
            "in a path (write it as %7B or %7D)",
        ),
        (
            {"url": "https://2130706433/"},
            f"url: {netguard.numeric_host_problem('2130706433')}",
        ),
        ({"url": "https://h.example/", "method": "GET"}, "method: must be POST, PUT or PATCH"),
        ({"url": "https://h.example/", "method": "put"}, "method: must be POST, PUT or PATCH"),
        ({"url": "https://h.example/", "method": None}, "method: must be POST, PUT or PATCH"),
        (
            {"url": "https://h.example/", "headers": ["X-A"]},
            "headers: must be a table of header names and their values",
        ),
        (
            {"url": "https://h.example/", "headers": {"Content-Length": "3"}},
            "headers.Content-Length: set by efd",
        ),
        ({"url": "https://h.example/", "headers": {"host": "x"}}, "headers.host: set by efd"),
        (
            {"url": "https://h.example/", "headers": {"User-Agent": "x"}},
            "headers.User-Agent: set by efd",
        ),
        (
            {"url": "https://h.example/", "headers": {"X-Signature": "x"}},
            "headers.X-Signature: set by efd",
        ),
        (
            {"url": "https://h.example/", "headers": {"Webhook-Signature": "x"}},
            "headers.Webhook-Signature: set by efd",
        ),
        (
            {"url": "https://h.example/", "headers": {"webhook-id": "x"}},
            "headers.webhook-id: set by efd",
        ),
        (
            {"url": "https://h.example/", "headers": {"webhook-timestamp": "x"}},
            "headers.webhook-timestamp: set by efd",
        ),
        (
            {"url": "https://h.example/", "headers": {"Content-Type": "text/plain"}},
            "headers.Content-Type: set by efd from content_type",
        ),
        (
            {"url": "https://h.example/", "headers": {"Transfer-Encoding": "chunked"}},
            "headers.Transfer-Encoding: a hop-by-hop header, which efd's connection sets",
        ),
        (
            {"url": "https://h.example/", "headers": {"Connection": "close"}},
            "headers.Connection: a hop-by-hop header, which efd's connection sets",
        ),
        (
            {"url": "https://h.example/", "headers": {"Keep-Alive": "1"}},
            "headers.Keep-Alive: a hop-by-hop header, which efd's connection sets",
        ),
        (
            {"url": "https://h.example/", "headers": {"Upgrade": "h2c"}},
            "headers.Upgrade: a hop-by-hop header, which efd's connection sets",
        ),
        (
            {"url": "https://h.example/", "headers": {"X Source": "efd"}},
            "headers.X Source: not a valid header name",
        ),
        (
            {"url": "https://h.example/", "headers": {"X-Source:": "efd"}},
            "headers.X-Source:: not a valid header name",
        ),
        (
            {"url": "https://h.example/", "headers": {"X-A": "a\r\nX-B: b"}},
            "headers.X-A: the value may not contain CR, LF or NUL",
        ),
        (
            {"url": "https://h.example/", "headers": {"X-A": "a\x01"}},
            "headers.X-A: the value may not contain control characters",
        ),
        (
            {"url": "https://h.example/", "headers": {"X-A": "é"}},
            "headers.X-A: the value must be ASCII",
        ),
        (
            {"url": "https://h.example/", "headers": {"X-A": 1}},
            "headers.X-A: the value must be a string",
        ),
        (
            {"url": "https://h.example/", "headers": {"X-A": "1", "x-a": "2"}},
            "headers.x-a: the same header as X-A (names ignore case)",
        ),
        (
            {"url": "https://h.example/", "content_type": "text/plain"},
            'content_type: must be "application/json" or "application/x-www-form-urlencoded"',
        ),
        (
            {"url": "https://h.example/", "content_type": "application/json; charset=utf-8"},
            'content_type: must be "application/json" or "application/x-www-form-urlencoded"',
        ),
    ],
)
def test_each_problem_names_its_key(keys: dict[str, Any], problem: str) -> None:
    assert refusal(**keys) == [problem]


def test_every_problem_is_listed_at_once() -> None:
    assert refusal(
        url="https://{{host}}/{{}}",
        method="DELETE",
        headers={"Host": "x", "X-A": "a\nb"},
        content_type="text/csv",
    ) == [
        f"url: {{{{host}}}}: {PLACEMENT}",
        "url: {{}} names no field; write its path, as in {{userId}}",
        "method: must be POST, PUT or PATCH",
        "headers.Host: set by efd",
        "headers.X-A: the value may not contain CR, LF or NUL",
        'content_type: must be "application/json" or "application/x-www-form-urlencoded"',
    ]


def test_a_template_in_the_scheme_is_refused() -> None:
    assert refusal(url="{{scheme}}://h.example/") == [f"url: {{{{scheme}}}}: {PLACEMENT}"]


def test_the_defaults_and_what_is_kept() -> None:
    request = checked(url="https://h.example/orders")
    assert isinstance(request, ActionRequest)
    assert (request.method, request.content_type, request.headers) == ("POST", JSON, ())
    assert checked(url="http://h.example/", method="PATCH").method == "PATCH"


# -- URLs


def test_a_url_without_templates_is_sent_as_configured() -> None:
    assert sent("https://h.example/orders?x=1", {}).url == "https://h.example/orders?x=1"


@pytest.mark.parametrize(
    "url", ["https://h.example/orders?x=1", "http://u:p@h.example:8080/a%20b/", "https://h.example"]
)
def test_a_url_without_templates_is_rendered_once_as_every_message_would_have_it(url: str) -> None:
    request = checked(url=url)
    assert request.fixed_url == render_url(request, {"a": 1})
    assert checked(url=url + "{{a}}" if "?" in url else url + "/{{a}}").fixed_url is None


@pytest.mark.parametrize(
    ("value", "path", "query"),
    [
        ("a b", "a%20b", "a%20b"),
        ("a/b", "a%2Fb", "a/b"),
        ("a?b", "a%3Fb", "a?b"),
        ("a#b", "a%23b", "a%23b"),
        ("100%", "100%25", "100%25"),
        ("a+b", "a%2Bb", "a%2Bb"),
        ("a&b=c", "a&b=c", "a%26b%3Dc"),
        ("é€😀", "%C3%A9%E2%82%AC%F0%9F%98%80", "%C3%A9%E2%82%AC%F0%9F%98%80"),
        ("-._~", "-._~", "-._~"),
        ("a:b@c", "a:b@c", "a:b@c"),
        ("\ud800", "%EF%BF%BD", "%EF%BF%BD"),
        ("...", "...", "..."),
    ],
)
def test_values_are_encoded_for_their_place(value: str, path: str, query: str) -> None:
    """The URL is the one the sender sends: every character but letters, digits and -._~ is
    percent-encoded, and the sender's URL reading then writes plain what means the same in
    that place (a '/' in a query; ':' and '@' in a path, which do not end a segment)."""
    request = sent(
        "https://h.example/u/{{userId}}/x?q={{properties.q}}&z=1",
        {"userId": value, "properties": {"q": value}},
    )
    assert request.url == f"https://h.example/u/{path}/x?q={query}&z=1"
    target = parse_target(request.url)
    assert (target.host, target.port, target.path) == (
        "h.example",
        443,
        f"/u/{path}/x?q={query}&z=1",
    )


@pytest.mark.parametrize(
    ("message", "rendered"),
    [
        ({}, "https://h.example/u//x?q="),
        ({"userId": None, "properties": {"q": None}}, "https://h.example/u//x?q="),
        ({"userId": 19.5, "properties": {"q": 10**21}}, "https://h.example/u/19.5/x?q=1e%2B21"),
        ({"userId": True, "properties": {"q": False}}, "https://h.example/u/true/x?q=false"),
        (
            {"userId": ["a", None, 1], "properties": {"q": {"k": "v"}}},
            "https://h.example/u/a,,1/x?q=%5Bobject%20Object%5D",
        ),
        ({"userId": "", "properties": "text"}, "https://h.example/u//x?q="),
    ],
)
def test_values_render_as_a_mapping_template_does(message: Any, rendered: str) -> None:
    """Missing and null are empty, as @template renders them; other values are JavaScript's
    String(value)."""
    assert sent("https://h.example/u/{{userId}}/x?q={{properties.q}}", message).url == rendered


def test_template_paths_follow_the_mapping_rules() -> None:
    message = {"properties": {"items": [{"sku": "A 1"}], "a b": "c"}}
    assert (
        sent("https://h.example/{{ properties.items[0].sku }}/{{properties.a b}}", message).url
        == "https://h.example/A%201/c"
    )


def test_a_port_userinfo_and_fragment_are_kept() -> None:
    request = sent("http://u:p@h.example:8080/{{userId}}?a={{userId}}#top", {"userId": "x y"})
    assert request.url == "http://u:p@h.example:8080/x%20y?a=x%20y#top"
    target = parse_target(request.url)
    assert (target.host, target.port, target.path) == ("h.example", 8080, "/x%20y?a=x%20y")
    assert target.authorization == "Basic dTpw"


def test_a_query_without_a_path() -> None:
    assert sent("https://h.example?id={{userId}}", {"userId": "1"}).url == "https://h.example/?id=1"


@pytest.mark.parametrize(
    ("url", "value"),
    [
        ("https://h.example/a/{{userId}}/b", ".."),
        ("https://h.example/a/{{userId}}", "."),
        ("https://h.example/a/.{{userId}}?x=1", "."),
        ("https://h.example/a/%2E{{userId}}", "."),
        ("https://h.example/{{userId}}{{userId}}", "."),
    ],
)
def test_a_value_that_would_make_a_dot_segment_is_refused(url: str, value: str) -> None:
    """A '..' segment would move the request up the path (the sender's URL reading removes
    dot segments, encoded or not)."""
    with pytest.raises(ActionRequestError) as caught:
        sent(url, {"userId": value})
    assert len(caught.value.problems) == 1
    assert caught.value.problems[0].startswith("url: a field makes the path segment ")


def test_dots_elsewhere_are_kept() -> None:
    assert (
        sent("https://h.example/a/{{userId}}x", {"userId": ".."}).url == "https://h.example/a/..x"
    )
    assert (
        sent("https://h.example/?q={{userId}}", {"userId": ".."}).url == "https://h.example/?q=.."
    )


# -- bodies and headers


def test_a_json_body_is_written_as_json_stringify_writes_it() -> None:
    value = {"b": 1.0, "a": [1e21, 5e-7, None, True], "2": "é\ud800", "1": {"x": "\u2028"}}
    body = sent("https://h.example/", {}, value).body
    assert body == ('{"1":{"x":"\u2028"},"2":"é\ufffd","b":1,"a":[1e+21,5e-7,null,true]}'.encode())


def test_a_json_body_may_be_any_value() -> None:
    assert sent("https://h.example/", {}, "text").body == b'"text"'
    assert sent("https://h.example/", {}, [1, 2]).body == b"[1,2]"


def test_a_form_body_is_written_as_the_whatwg_serializer_writes_it() -> None:
    value = {
        "name": "Ann Lee",
        "sym": "a+b=c&d~*-._!'()",
        "é": "€",
        "n": 19.5,
        "big": 10**21,
        "t": True,
        "none": None,
        "items": [1, {"k": "v w"}],
        "obj": {"a": None},
        "2": "\ud800",
    }
    request = sent("https://h.example/", {}, value, content_type=FORM)
    assert request.body == (
        b"2=%EF%BF%BD&name=Ann+Lee&sym=a%2Bb%3Dc%26d%7E*-._%21%27%28%29&%C3%A9=%E2%82%AC"
        b"&n=19.5&big=1e%2B21&t=true&none=&items=%5B1%2C%7B%22k%22%3A%22v+w%22%7D%5D"
        b"&obj=%7B%22a%22%3Anull%7D"
    )
    assert request.headers == {"Content-Type": "application/x-www-form-urlencoded"}


def test_an_empty_object_is_an_empty_form() -> None:
    assert sent("https://h.example/", {}, {}, content_type=FORM).body == b""


@pytest.mark.parametrize(
    ("value", "kind"), [([1], "an array"), ("a", "not an object"), (None, "not an object")]
)
def test_a_form_body_needs_an_object(value: Any, kind: str) -> None:
    request = checked(url="https://h.example/", content_type=FORM)
    with pytest.raises(ActionRequestError) as caught:
        render(request, {}, value)
    assert caught.value.problems == (
        f"data: a form body is made of an object's keys, and the mapped value is {kind}",
    )


def test_method_and_headers_exactly() -> None:
    request = render(
        checked(
            url="https://h.example/",
            method="PUT",
            headers={"X-Source": "efd", "Authorization": "Bearer t", "x-tab": "a\tb"},
        ),
        {},
        {"a": 1},
    )
    assert request == Request(
        "PUT",
        "https://h.example/",
        {
            "X-Source": "efd",
            "Authorization": "Bearer t",
            "x-tab": "a\tb",
            "Content-Type": "application/json",
        },
        b'{"a":1}',
    )
    assert list(request.headers) == ["X-Source", "Authorization", "x-tab", "Content-Type"]


# -- no message chooses where efd connects

_text = st.text(
    st.characters(codec=None, exclude_categories=()) | st.sampled_from(list("/?#%.&=+@:[]\\ ")),
    max_size=12,
)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)
# Each URL with the start every rendering of it has.
_URLS = [
    ("https://h.example/{{a}}", "https://h.example/"),
    (
        "https://h.example:8443/x/{{a}}{{b}}/y?{{a}}={{b}}&c={{c.d}}",
        "https://h.example:8443/x/",
    ),
    ("http://u:p@[2001:db8::1]:81/{{a}}/.{{b}}?q={{a}}#f", "http://u:p@[2001:db8::1]:81/"),
    ("https://h.example?{{a}}", "https://h.example"),
    ("https://xn--exmple-cua.example/%2E{{a}}/{{b}}", "https://xn--exmple-cua.example/."),
]
_REQUESTS = [checked(url=url) for url, _ in _URLS]


@settings(max_examples=600, deadline=None)
@given(
    index=st.integers(0, len(_URLS) - 1),
    message=st.fixed_dictionaries(
        {}, optional={"a": _json, "b": _json, "c": st.dictionaries(st.just("d"), _json)}
    )
    | _json,
    value=_json,
    form=st.booleans(),
)
def test_no_message_changes_where_efd_connects(
    index: int, message: Any, value: Any, form: bool
) -> None:
    url, start = _URLS[index]
    request = checked(url=url, content_type=FORM) if form else _REQUESTS[index]
    configured = parse_target(url.replace("{{", "").replace("}}", ""))
    try:
        rendered = render(request, message, value)
    except ActionRequestError:
        return
    target = parse_target(rendered.url)
    assert (target.tls, target.host, target.port, target.host_header, target.authorization) == (
        configured.tls,
        configured.host,
        configured.port,
        configured.host_header,
        configured.authorization,
    )
    # What is shown is what is sent: the sender's reading of the URL changes nothing in it.
    shown = urlsplit(rendered.url)
    assert target.path == (shown.path or "/") + (f"?{shown.query}" if shown.query else "")
    assert rendered.url.startswith(start)
    assert isinstance(rendered.body, bytes)


@pytest.mark.parametrize("content_type", [JSON, FORM])
def test_a_value_that_is_not_json_is_refused_with_the_modules_error(content_type: str) -> None:
    request = checked(url="https://h.example/", content_type=content_type)
    with pytest.raises(ActionRequestError) as caught:
        render(request, {}, {"a": {1, 2}})
    assert caught.value.problems == ("data: the mapped value cannot be written as JSON",)


def test_the_url_rule_handed_in_judges_the_url_without_its_templates() -> None:
    seen: list[str] = []

    def rule(url: str) -> str | None:
        seen.append(url)
        return "not this one"

    with pytest.raises(ActionRequestError) as caught:
        compile_request(url="https://h.example/{{ a b }}?q={{c}}", url_problem=rule)
    assert caught.value.problems == ("url: not this one",)
    assert seen == ["https://h.example/x?q=x"]


@pytest.mark.parametrize("content_type", [JSON, FORM])
def test_a_mapped_body_larger_than_a_delivery_carries_is_refused(content_type: str) -> None:
    request = checked(url="https://h.example/", content_type=content_type)
    fits = render(request, {}, {"a": "x" * (MAX_MESSAGE_BYTES - 10)})
    assert len(fits.body) <= MAX_MESSAGE_BYTES
    with pytest.raises(ActionRequestError) as caught:
        render(request, {}, {"a": "x" * MAX_MESSAGE_BYTES})
    [problem] = caught.value.problems
    assert problem.startswith("data: the mapped body is ")
    assert problem.endswith(f"bytes; a delivery carries at most {MAX_MESSAGE_BYTES}")
