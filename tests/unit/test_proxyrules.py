"""efd.delivery.proxyrules: the proxy's URL, no_proxy, the CONNECT request and the proxy's
answer to it, byte by byte."""

from __future__ import annotations

import ipaddress

import pytest

from efd.delivery.proxyrules import (
    MAX_CONNECT_HEAD,
    Bypass,
    ConnectAnswer,
    Egress,
    Proxy,
    ProxyConfigError,
    ProxyProtocolError,
    absolute_target,
    connect_request,
    egress,
    own_answer,
    parse_no_proxy,
    parse_proxy,
    read_connect_answer,
    refusal,
)


def test_a_proxy_url_with_credentials() -> None:
    proxy = parse_proxy("http://user:pass@proxy.internal:3128")
    assert proxy == Proxy("proxy.internal", 3128, "Basic dXNlcjpwYXNz")  # user:pass
    assert proxy.shown == "proxy.internal:3128"
    # Neither the credentials nor their Basic form, which is as good as them, in a repr.
    assert repr(proxy) == "Proxy(host='proxy.internal', port=3128)"
    assert "dXNlcjpwYXNz" not in repr(egress("http://user:pass@proxy.internal:3128", []))


def test_percent_encoded_credentials_are_decoded_and_sent_as_utf_8() -> None:
    proxy = parse_proxy("http://us%40er:p%3As%C3%A9@10.0.0.1:8080/")
    # base64 of b"us@er:p:s\xc3\xa9"
    assert proxy == Proxy("10.0.0.1", 8080, "Basic dXNAZXI6cDpzw6k=")


def test_a_proxy_without_credentials_and_an_ipv6_proxy() -> None:
    assert parse_proxy("http://proxy:3128") == Proxy("proxy", 3128, None)
    proxy = parse_proxy("http://[fd00::1]:3128")
    assert proxy == Proxy("fd00::1", 3128, None)
    assert proxy.shown == "[fd00::1]:3128"


def test_a_user_without_a_password_is_sent_with_an_empty_one() -> None:
    assert parse_proxy("http://user@proxy:3128").authorization == "Basic dXNlcjo="  # user:


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("https://proxy:3128", "an https:// proxy (TLS to the proxy itself) is not supported"),
        ("socks5://proxy:1080", "must be an http:// URL"),
        ("proxy:3128", "must be an http:// URL"),
        ("http://proxy", "must name the proxy's port"),
        ("http://proxy:0", "has port 0"),
        ("http://proxy:99999", "must be an http:// URL"),
        ("http://proxy:3128/path", "must be the proxy's address only"),
        ("http://proxy:3128/?q=1", "must be the proxy's address only"),
        ("http://pro xy:3128", "without spaces"),
        ("http://127.1:3128", "numeric IPv4 form"),
        ("http://:3128", "must be an http:// URL"),
    ],
)
def test_proxy_urls_efd_cannot_use_are_refused_saying_why(url: str, reason: str) -> None:
    with pytest.raises(ProxyConfigError) as raised:
        parse_proxy(url)
    assert reason in str(raised.value)


def test_a_refusal_never_quotes_the_credentials() -> None:
    for url in ("https://user:secret@proxy:3128", "http://user:secret@proxy", "ftp://u:secret@p:1"):
        with pytest.raises(ProxyConfigError) as raised:
            parse_proxy(url)
        assert "secret" not in str(raised.value)


def test_the_connect_request_byte_by_byte() -> None:
    assert connect_request("hooks.example.com", 443, None) == (
        b"CONNECT hooks.example.com:443 HTTP/1.1\r\nHost: hooks.example.com:443\r\n\r\n"
    )
    assert connect_request("2001:db8::5", 8443, "Basic dXNlcjpwYXNz") == (
        b"CONNECT [2001:db8::5]:8443 HTTP/1.1\r\nHost: [2001:db8::5]:8443\r\n"
        b"Proxy-Authorization: Basic dXNlcjpwYXNz\r\n\r\n"
    )


def test_plain_http_goes_in_absolute_form() -> None:
    assert absolute_target("127.0.0.1:8080", "/hook?a=%20b") == "http://127.0.0.1:8080/hook?a=%20b"
    assert absolute_target("[::1]:80", "/") == "http://[::1]:80/"


def test_no_proxy_names_domains_and_networks() -> None:
    bypass = parse_no_proxy(["Internal.Example.", ".corp.example", "10.0.0.0/8", "::1", "1.2.3.4"])
    assert bypass == Bypass(
        frozenset({"internal.example"}),
        (".corp.example",),
        (
            ipaddress.ip_network("10.0.0.0/8"),
            ipaddress.ip_network("::1/128"),
            ipaddress.ip_network("1.2.3.4/32"),
        ),
    )
    direct = ["internal.example", "INTERNAL.example.", "a.corp.example", "b.a.corp.example"]
    direct += ["10.20.30.40", "::1", "1.2.3.4"]
    proxied = ["example", "corp.example", "xcorp.example", "other.internal.example"]
    proxied += ["11.0.0.1", "::2", "1.2.3.5", "a.corp.example.net"]
    assert [host for host in direct if not bypass.matches(host)] == []
    assert [host for host in proxied if bypass.matches(host)] == []


def test_no_proxy_entries_efd_cannot_read_are_all_named() -> None:
    with pytest.raises(ProxyConfigError) as raised:
        parse_no_proxy(["ok.example", "host:8080", "*", "bücher.example", "", "10.0.0.0/33"])
    assert str(raised.value).startswith(
        "not a host name, .domain, IP address or CIDR network: "
        "'host:8080', '*', 'bücher.example', '', '10.0.0.0/33'"
    )


def test_the_egress_sends_bypassed_hosts_direct() -> None:
    route = egress("http://proxy:3128", ["localhost"])
    assert route == Egress(Proxy("proxy", 3128, None), Bypass(frozenset({"localhost"})))
    assert route.proxy_for("localhost") is None
    assert route.proxy_for("example.com") == route.proxy
    assert egress(None, ["localhost"]) is None


@pytest.mark.parametrize(
    ("data", "answer"),
    [
        (
            b"HTTP/1.1 200 Connection established\r\n\r\n",
            ConnectAnswer(200, "Connection established", b""),
        ),
        (
            b"HTTP/1.0 200 OK\r\nProxy-Agent: x\r\n\r\n\x16\x03",
            ConnectAnswer(200, "OK", b"\x16\x03"),
        ),
        (b"HTTP/1.1 407 Proxy Authentication Required\r\n", None),
        (b"HTTP/1", None),
        (b"", None),
        (b"HTTP/1.1 204\r\n\r\n", ConnectAnswer(204, "", b"")),
    ],
)
def test_reading_the_answer_to_connect(data: bytes, answer: ConnectAnswer | None) -> None:
    assert read_connect_answer(data) == answer


def test_the_reason_is_kept_printable_and_short() -> None:
    answer = read_connect_answer(b"HTTP/1.1 403 Forbidden \x01" + b"x" * 100 + b"\r\n\r\n")
    assert answer == ConnectAnswer(403, "Forbidden ?" + "x" * 49, b"")


@pytest.mark.parametrize(
    "data",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"<html>",
        b"HTTP/2 200\r\n\r\n",
        b"HTTP/1.1 20 OK\r\n\r\n",
        b"HTTP/1.1 200OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * (MAX_CONNECT_HEAD // 6),
        b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * (MAX_CONNECT_HEAD // 6) + b"\r\n",
    ],
)
def test_answers_that_are_not_http_are_refused(data: bytes) -> None:
    with pytest.raises(ProxyProtocolError):
        read_connect_answer(data)


def test_a_refusal_is_the_proxys_and_names_no_credentials() -> None:
    proxy = parse_proxy("http://user:secret@proxy.internal:3128")
    for status, reason in [(407, "Proxy Authentication Required"), (403, "Forbidden")]:
        message = refusal(proxy, ConnectAnswer(status, reason, b""), "hooks.example", 443)
        assert message == (
            f"proxy proxy.internal:3128 answered {status} {reason} to CONNECT hooks.example:443"
        )
    assert refusal(proxy, ConnectAnswer(502, "", b""), "::1", 8443) == (
        "proxy proxy.internal:3128 answered 502 to CONNECT [::1]:8443"
    )
    assert refusal(proxy, ConnectAnswer(200, "Connection established", b""), "h", 1) is None


def test_in_absolute_form_a_407_or_an_answer_without_via_is_the_proxys() -> None:
    proxy = Proxy("proxy", 3128, None)
    assert own_answer(proxy, 407, "Proxy Authentication Required", True) == (
        "proxy proxy:3128 answered 407 Proxy Authentication Required"
    )
    assert own_answer(proxy, 407, "", False) == "proxy proxy:3128 answered 407"
    assert own_answer(proxy, 401, "Unauthorized", False) == (
        "proxy proxy:3128 answered 401 Unauthorized itself (the answer has no Via header)"
    )
    assert own_answer(proxy, 502, "Bad\x00 Gateway", False) == (
        "proxy proxy:3128 answered 502 Bad? Gateway itself (the answer has no Via header)"
    )
    # Forwarded (Via): the receiver's, whatever it says; a 2xx is the receiver's either way.
    assert [s for s in (401, 403, 500, 502, 504) if own_answer(proxy, s, "", True)] == []
    assert [s for s in (200, 204) if own_answer(proxy, s, "OK", False)] == []
