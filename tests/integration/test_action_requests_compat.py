"""Actions' requests (efd/segment/actions.py) as a receiver on WHATWG's URL and
URLSearchParams reads them, in Node: a form body is the bytes URLSearchParams writes for the
same object, and a rendered URL keeps its host while each path segment and query parameter
decodes to the field's value, whatever characters the values hold."""

from __future__ import annotations

import json
import random
import re
import subprocess
from typing import Any

from efd import jsonjs
from efd.delivery import netguard
from efd.languages.mapping.values import js_string
from efd.segment.actions import (
    FORM,
    ActionRequest,
    ActionRequestError,
    compile_request,
    render,
)
from tests.jsclients import JS, node


def checked(**keys: Any) -> ActionRequest:
    """An action's request compiled as the configuration compiles it."""
    return compile_request(url_problem=netguard.http_url_problem, **keys)


# Characters that mean something in a URL or a form, and some that need several bytes.
ALPHABET = [*"/?#%&=+;:@!$'()*,[]\\ .~-_\"<>^`{|}aZ09", "é", "€", "😀", "\ud800", "\t", "\n"]


def words(rng: random.Random, count: int) -> list[str]:
    return ["".join(rng.choices(ALPHABET, k=rng.randint(0, 8))) for _ in range(count)]


def scalar(rng: random.Random) -> Any:
    return rng.choice([None, True, False, 0, -1.5, 19.5, 1e21, 5e-7, 2**53 + 2, *words(rng, 6)])


def value(rng: random.Random, depth: int = 0) -> Any:
    if depth < 2 and rng.random() < 0.3:
        if rng.random() < 0.5:
            return [value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
        return {key: value(rng, depth + 1) for key in words(rng, rng.randint(0, 3))}
    return scalar(rng)


def readers(forms: list[Any], urls: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [node(), "action-requests.mjs"],
        cwd=JS,
        input=jsonjs.dumps({"forms": forms, "urls": urls}),
        capture_output=True,
        timeout=60,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def usv(text: str) -> str:
    """A string as WHATWG's algorithms take it: a lone surrogate is U+FFFD."""
    return re.sub("[\ud800-\udfff]", "\ufffd", text)


def test_form_bodies_are_what_urlsearchparams_writes() -> None:
    rng = random.Random(52)
    forms = [{key: value(rng) for key in words(rng, rng.randint(0, 6))} for _ in range(300)]
    forms.append({"10": 1, "b": None, "2": "x", "a b": "c+d"})  # index-like keys first
    request = checked(url="https://h.example/", content_type=FORM)
    ours = [render(request, {}, form).body.decode("ascii") for form in forms]
    assert ours == readers(forms, [])["forms"]


def test_rendered_urls_read_back_as_the_values() -> None:
    rng = random.Random(53)
    request = checked(url="https://h.example:8443/u/{{a}}/x?q={{b}}&r={{c.d}}")
    messages: list[dict[str, Any]] = []
    urls: list[str] = []
    while len(urls) < 400:
        message = {"a": scalar(rng), "b": value(rng), "c": {"d": scalar(rng)}}
        try:
            urls.append(render(request, message, {}).url)
        except ActionRequestError:
            continue  # a "." or ".." segment, which is refused
        messages.append(message)
    theirs = readers([], urls)["urls"]

    def text(field: Any) -> str:
        return "" if field is None else usv(js_string(field))

    for message, url, read in zip(messages, urls, theirs, strict=True):
        assert (read["protocol"], read["host"], read["username"]) == (
            "https:",
            "h.example:8443",
            "",
        ), url
        assert read["segments"] == ["", "u", text(message["a"]), "x"], url
        assert read["query"] == [["q", text(message["b"])], ["r", text(message["c"]["d"])]], url
