"""The OpenAPI description (efd/http/openapi/) is written by hand: these hold it to the
handlers, so it cannot drift from them. Every route the APIs register is described and
nothing else is, with its methods and path parameters; the fields and filters it names are
those the handlers read; the admin filters' schemas accept exactly what their validators
accept; every status a handler's refusals carry is among its operation's answers.
tests/integration/test_openapi.py then runs schemathesis and redocly against a daemon."""

from __future__ import annotations

import ast
import inspect
import re
from datetime import UTC, datetime
from types import MethodType, ModuleType
from typing import Any, Protocol

import jsonschema_rs
import pytest
from aiohttp import web

from efd import __version__
from efd.errors import ClientError
from efd.http import admin, ingest, live, regulations, status
from efd.http.openapi import document
from efd.operations import selection
from efd.records import DeliveryStatus
from efd.segment import messages, payload
from efd.store.regulations import REGULATION_TYPES

DOCUMENT = document(__version__)
PATHS: dict[str, dict[str, Any]] = DOCUMENT["paths"]
METHODS = ("get", "put", "post", "delete", "patch", "options", "head")
NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC).timestamp()

# Routes served but not part of the API: the console's page and its assets, for browsers.
NOT_AN_API = {("GET", "/console"), ("GET", "/console/{}")}


class _Api(Protocol):
    def routes(self) -> list[web.RouteDef]: ...


def _routes() -> list[web.RouteDef]:
    """What each API registers. routes() reads no state, so the objects need none."""
    apis: tuple[type[_Api], ...] = (
        ingest.Ingest,
        status.Status,
        regulations.RegulationsApi,
        admin.AdminApi,
        live.LiveApi,
    )
    return [route for api in apis for route in object.__new__(api).routes()]


def _shape(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def _operations(prefix: str) -> list[dict[str, Any]]:
    return [
        item[method]
        for path, item in PATHS.items()
        if path.startswith(prefix)
        for method in METHODS
        if method in item
    ]


def _body(path: str) -> dict[str, Any]:
    schema: dict[str, Any] = PATHS[path]["post"]["requestBody"]["content"]["application/json"][
        "schema"
    ]
    return schema


def test_every_registered_route_is_described_and_nothing_else() -> None:
    registered = {(r.method, _shape(r.path)) for r in _routes()} - NOT_AN_API
    described = {
        (method.upper(), _shape(path)) for path, item in PATHS.items() for method in item
    } - {("PARAMETERS", _shape(path)) for path in PATHS}
    assert registered == described
    assert len(_routes()) == len({(r.method, r.path) for r in _routes()})  # no route twice


# Paths that are another path's second name (Segment's libraries post to both): the same
# handler and the same description. tests/integration/test_openapi.py fuzzes only the first.
ALIASES = {
    "/v1/import": "/v1/batch",
    "/v1/b": "/v1/batch",
    **{f"/v1/{name[0]}": f"/v1/{name}" for name in ingest.SINGLE_TYPES if len(name) > 1},
}


def test_an_alias_is_served_and_described_as_its_path_is() -> None:
    routes = {route.path: route for route in _routes()}
    assert len(ALIASES) == 8
    for alias, path in ALIASES.items():
        assert routes[alias].method == routes[path].method == "POST"
        handler, its_paths = routes[alias].handler, routes[path].handler
        assert isinstance(handler, MethodType)
        assert isinstance(its_paths, MethodType)
        assert handler.__func__ is its_paths.__func__
        if path != "/v1/batch":
            assert ingest.SINGLE_TYPES[alias[4:]] == ingest.SINGLE_TYPES[path[4:]]
        names = ("operationId", "summary")
        ours = {k: v for k, v in PATHS[alias]["post"].items() if k not in names}
        theirs = {k: v for k, v in PATHS[path]["post"].items() if k not in names}
        assert ours == theirs, alias


def test_path_parameters_are_those_of_the_route() -> None:
    for route in _routes():
        if (route.method, _shape(route.path)) in NOT_AN_API:
            continue
        (path,) = [p for p in PATHS if _shape(p) == _shape(route.path)]
        given = [p["name"] for p in PATHS[path].get("parameters", []) if p["in"] == "path"]
        # The description spells them as the API's fields do (messageId for message_id).
        named = [n.replace("_id", "Id") for n in re.findall(r"\{([^}]*)\}", route.path)]
        assert given == named, route.path


def test_the_admin_filters_and_fields_are_those_the_rules_read() -> None:
    query = PATHS["/admin/deliveries"]["get"]["parameters"]
    assert [p["name"] for p in query] == list(selection.LIST_FILTERS)
    assert not any(p["required"] for p in query)  # every filter may be left out
    assert list(_body("/admin/redrive")["properties"]) == list(selection.REDRIVE_FIELDS)
    assert list(_body("/admin/discard")["properties"]) == list(selection.DISCARD_FIELDS)
    assert _body("/admin/discard")["required"] == ["destination"]
    assert list(_body("/admin/replay")["properties"]) == list(selection.REPLAY_FIELDS)
    assert _body("/admin/replay")["required"] == ["source", "messageId"]
    statuses = {p["name"]: p["schema"] for p in query}["status"]["enum"]
    assert statuses == [s.value for s in DeliveryStatus]


def test_the_regulation_request_is_the_one_the_api_parses() -> None:
    body = _body("/regulations")
    assert body == _body("/regulations/sources/{source}")
    assert list(body["properties"]) == list(regulations.REQUEST_FIELDS)
    assert body["required"] == list(regulations.REQUEST_FIELDS)
    assert body["properties"]["regulationType"]["enum"] == list(REGULATION_TYPES)
    assert body["properties"]["subjectType"]["enum"] == [regulations.SUBJECT_TYPE]
    ids = body["properties"]["subjectIds"]
    assert ids["maxItems"] == regulations.MAX_SUBJECTS
    assert ids["items"]["maxLength"] == regulations.MAX_SUBJECT_CHARS


def _probes() -> list[tuple[str, str]]:
    text = ["", "a", "a" * selection.MAX_TEXT, "a" * (selection.MAX_TEXT + 1), "a\x00b"]
    times = [
        "2h",
        "90s",
        "999999999d",
        "1000000000s",
        "2h30m",
        "2026-11-24",
        "2026-11-24T10:00:00Z",
    ]
    times += ["2026-11-24T10:00:00+02:00", "yesterday", "", "2026-13-01"]
    limits = ["0", "1", str(selection.DEFAULT_LIMIT), str(selection.MAX_LIMIT)]
    limits += [str(selection.MAX_LIMIT + 1), "-1", "x", ""]
    cursors = ["0", "1", str(2**63 - 1), str(2**63), "-5", "1.5"]
    return [
        *[("destination", v) for v in text],
        *[("source", v) for v in text],
        *[("user_id", v) for v in text],
        *[("message_id", v) for v in text],
        *[("status", v) for v in [s.value for s in DeliveryStatus] + ["nope", ""]],
        *[("since", v) for v in times],
        *[("until", v) for v in times],
        *[("limit", v) for v in limits],
        *[("cursor", v) for v in cursors],
    ]


@pytest.mark.parametrize(("name", "value"), _probes())
def test_a_filter_schema_accepts_what_its_validator_accepts(name: str, value: str) -> None:
    (schema,) = [
        p["schema"] for p in PATHS["/admin/deliveries"]["get"]["parameters"] if p["name"] == name
    ]
    # A query string carries text; an integer parameter is sent as its digits.
    given: Any = int(value) if schema.get("type") == "integer" and value.isdigit() else value
    described = jsonschema_rs.validator_for(schema, validate_formats=True).is_valid(given)
    refusal = _refusal(name, value)
    assert described == (refusal is None)
    if refusal is not None:  # refused as the description says: 400, the filter named
        assert (refusal.status, refusal.field) == (400, name)


def _refusal(name: str, value: str) -> ClientError | None:
    try:
        selection.list_query({name: value}, NOW)
    except ClientError as error:
        return error
    return None


def _statuses(module: ModuleType) -> set[int]:
    """The statuses of the ClientErrors a module raises (400 unless it says otherwise)."""
    found: set[int] = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ClientError":
            value = {k.arg: k.value for k in node.keywords}.get("status")
            if not isinstance(node.args[0], ast.Constant):
                continue  # one built again from another's parts (a parser process's answer)
            assert value is None or isinstance(value, ast.Constant), ast.unparse(node)
            code = 400 if value is None else value.value
            assert isinstance(code, int), ast.unparse(node)
            found.add(code)
    return found


@pytest.mark.parametrize(
    ("prefix", "modules"),
    [
        ("/v1/", [ingest, payload, messages]),
        ("/regulations", [regulations]),
        ("/admin/", [admin, selection, live]),
    ],
)
def test_every_refusal_a_handler_can_answer_is_described(
    prefix: str, modules: list[ModuleType]
) -> None:
    raised = set().union(*(_statuses(m) for m in modules))
    assert raised  # the modules do refuse: the search below finds their refusals
    for operation in _operations(prefix):
        answers = {int(code) for code in operation["responses"]}
        # A refusal that only some of the API's routes can give is described on at least one.
        assert {401, 403} & raised <= answers, operation["operationId"]
    described = {int(code) for op in _operations(prefix) for code in op["responses"]}
    assert raised <= described


def test_refusals_are_described_as_errors() -> None:
    error = DOCUMENT["components"]["schemas"]["Error"]
    fields = ClientError("c", "m", field="f", index=0).as_json()
    assert set(error["properties"]) == set(fields)
    assert set(error["required"]) == set(ClientError("c", "m").as_json())
    for operation in _operations("/"):
        for code, answer in operation["responses"].items():
            if code.startswith("4") and "application/json" in answer.get("content", {}):
                schema = answer["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Error"}, operation["operationId"]
