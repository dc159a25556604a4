"""A source's allowed_origins (efd/http/origins.py): which Origin headers a pattern admits,
and what a bad pattern is told. tests/integration/test_cors.py checks the answers a daemon
gives pages."""

from __future__ import annotations

import pytest

from efd.http.origins import AllowedOrigins, check_pattern

# The allowed_origins tests/integration/test_cors.py gives its daemon, and what they admit.
SHOP_PATTERNS = ["https://shop.example", "https://*.cdn.example"]
SHOP_ACCEPTED = ["https://shop.example", "https://shop.example:443", "https://a.cdn.example"]
SHOP_REFUSED = [
    "https://evil.example",
    "http://shop.example",  # another scheme
    "https://shop.example:8443",  # another port
    "https://sub.shop.example",  # only *.cdn.example allows subdomains
    "https://cdn.example",  # *.cdn.example: subdomains only
    "https://evilcdn.example",
    "null",  # sandboxed frames, file: pages
]


def test_origin_rules() -> None:
    allowed = AllowedOrigins(
        [
            "https://Shop.Example",
            "http://localhost:3000",
            "https://*.example.com",
            "http://[::1]:8080",
        ]
    )
    for origin in [
        "https://shop.example",
        "https://shop.example:443",
        "http://localhost:3000",
        "https://a.example.com",
        "https://a.b.example.com",
        "http://[::1]:8080",
    ]:
        assert allowed.allows(origin), origin
    for origin in [
        "https://example.com",
        "https://badexample.com",
        "http://a.example.com",
        "https://a.example.com:8443",
        "http://localhost",
        "http://localhost:3001",
        "https://shop.example/",
        "null",
        "",
        "https://*.example.com",
    ]:
        assert not allowed.allows(origin), origin
    assert AllowedOrigins([]).allows("https://shop.example") is False


@pytest.mark.parametrize(
    ("pattern", "words"),
    [
        ("shop.example", "with http or https"),
        ("ftp://shop.example", "with http or https"),
        ("https://shop.example/", "without a path"),
        ("https://shop.example/app", "without a path"),
        ("https://shop.example?x", "without a path"),
        ("https://user@shop.example", "without user"),
        ("https://shop.example:99999", "port"),
        ("https://shop.example:https", "port"),
        ("https://", "no host"),
        ("https://sh op.example", "no spaces"),
        ("https://bücher.example", "xn--"),
        ("https://shop_x.example", "is not a host"),
        ("https://*", "wildcard"),
        ("https://a.*.example", "wildcard"),
        ("https://*shop.example", "wildcard"),
        ("https://*.*.example", "wildcard"),
        ("https://*.127.0.0.1", "wildcard"),
        ("*", "leave allowed_origins out"),
    ],
)
def test_bad_patterns_say_what_is_wrong(pattern: str, words: str) -> None:
    with pytest.raises(ValueError, match="must be an origin") as caught:
        check_pattern(pattern)
    assert words in str(caught.value)


@pytest.mark.parametrize(
    ("origin", "admitted"),
    [(o, True) for o in SHOP_ACCEPTED] + [(o, False) for o in SHOP_REFUSED],
)
def test_a_source_admits_its_listed_origins_only(origin: str, admitted: bool) -> None:
    assert AllowedOrigins(SHOP_PATTERNS).allows(origin) is admitted
