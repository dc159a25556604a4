"""The configuration's shape: one frozen model a section, each checking its own values.

Rules that span entries (unique names, references that resolve) are in efd.config.checks.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PrivateAttr,
    SecretStr,
    TypeAdapter,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from efd.brokers import headers as broker_headers
from efd.brokers import targets as broker_targets
from efd.brokers.targets import BrokerConfigError, Target
from efd.delivery import batching, netguard, outauth, proxyrules, ratelimit, tls
from efd.delivery.lanes import Ordering
from efd.http.origins import check_pattern
from efd.languages import mapping, triggers
from efd.languages.audiences import ParseError, parse_condition, parse_expression
from efd.languages.filters import Condition, Filter, FilterSet, FqlError, parse_field_path
from efd.operations.events import OPERATIONS_SOURCE
from efd.personas.keys import snake_case
from efd.segment import actions
from efd.segment.routing import Action, ActionSet
from efd.segment.webhooks import (
    DEFAULT_USER_AGENT,
    HEADER_NAME,
    RESERVED_HEADERS,
    ClientCert,
    Route,
    header_value_problem,
    standard_secret,
)

MAX_HOOKS = 5
MAX_ACTIONS = 5
MIN_ADMIN_TOKEN_CHARS = 16
Seconds = Annotated[float, Field(gt=0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KeyedProblems(ValueError):
    """Problems a validator found in its value, each "key.path: reason", the path from the
    model that holds the value: efd.config.loading reports each under its own key."""

    def __init__(self, problems: list[str] | tuple[str, ...]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8088, ge=0, le=65535)
    # Bearer token for the admin endpoints (/regulations, /metrics); unset turns them off.
    admin_token: SecretStr | None = None
    # Child processes that parse large ingestion bodies (0: the daemon parses everything).
    # Unset: one, or none where the daemon may use one CPU only (Settings.helpers).
    parse_processes: int | None = Field(default=None, ge=0, le=32)
    # Connections open at once; one more is answered 503 and closed.
    max_connections: int = Field(default=1024, ge=1, le=1_000_000)
    # Of those, from one client address (an IPv6 /64); unset: half of max_connections.
    max_connections_per_address: int | None = Field(default=None, ge=1, le=1_000_000)
    # A request's headers and body must all arrive within this, from its first byte.
    request_timeout_seconds: Seconds = 30
    # An idle keep-alive connection is closed after this.
    keepalive_timeout_seconds: Seconds = 15

    @field_validator("admin_token")
    @classmethod
    def _strong_token(cls, token: SecretStr | None) -> SecretStr | None:
        if token is None:
            return None
        value = token.get_secret_value()
        if value != value.strip() or not value.strip():
            raise ValueError("may not be empty or begin or end with whitespace")
        if len(value) < MIN_ADMIN_TOKEN_CHARS:
            raise ValueError(
                f"must be at least {MIN_ADMIN_TOKEN_CHARS} characters (leave it unset to turn "
                "the admin endpoints off)"
            )
        if not (value.isascii() and value.isprintable()) or " " in value:
            raise ValueError("must be printable ASCII without spaces (it travels in a header)")
        return token


class StorageConfig(_Strict):
    url: str = "sqlite:///var/lib/efd/efd.db"
    retention_days: float = Field(default=7, gt=0)
    # How often retention runs (once per cluster); its first run is soon after start.
    retention_interval_seconds: Seconds = 600
    # FULL: an acknowledged message survives power loss, not just a process crash.
    sqlite_synchronous: Literal["FULL", "NORMAL"] = "FULL"
    pool_size: int = Field(default=5, ge=1)

    @field_validator("url")
    @classmethod
    def _known_backend(cls, url: str) -> str:
        scheme = url.split(":", 1)[0].split("+", 1)[0]
        if scheme not in ("sqlite", "postgresql", "postgres"):
            raise ValueError("must be a sqlite:/// or postgresql:// URL")
        return url


class DeliveryConfig(_Strict):
    timeout_seconds: Seconds = 5
    retry_initial_seconds: Seconds = 5
    retry_max_seconds: Seconds = 1800
    retry_window_seconds: Seconds = 14400
    user_agent: str = Field(default=DEFAULT_USER_AGENT, min_length=1)
    allowed_networks: list[str] = Field(default_factory=list)
    # Extra CA certificates (PEM) to trust, for receivers behind an internal CA.
    ca_file: str | None = None
    max_in_flight: int = Field(default=1024, ge=1)
    max_per_hook: int = Field(default=64, ge=1)
    # Child processes that sign and send the requests (0: the daemon's own process does).
    # Unset: one (on a 2-core host a second delivers no faster), or none where the daemon may
    # use one CPU only (Settings.helpers; docs/delivery.md#sender-processes).
    sender_processes: int | None = Field(default=None, ge=0, le=32)
    # How long a claimed delivery is reserved; must outlast a round of attempts.
    lease_seconds: Seconds = 60
    response_head_bytes: int = Field(default=512, ge=0, le=65536)
    # A hook to which attempts of `circuit_failures` messages failed (worth a retry), with no
    # other answer between, is left out of rounds, but for one probe every
    # `circuit_probe_seconds`.
    circuit_failures: int = Field(default=10, ge=1, le=100000)
    circuit_probe_seconds: Seconds = 30
    # An HTTP proxy every delivery goes through (http://[user:password@]host:port), and the
    # hosts reached directly instead: names, .domains, IP addresses and CIDR networks. Secret:
    # the URL may hold the proxy's credentials, and no repr of the settings shows them.
    proxy: SecretStr | None = None
    no_proxy: list[str] = Field(default_factory=list)

    @field_validator("proxy")
    @classmethod
    def _proxy_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            try:
                proxyrules.parse_proxy(value.get_secret_value())
            except proxyrules.ProxyConfigError as error:
                raise ValueError(str(error)) from None
        return value

    @field_validator("no_proxy")
    @classmethod
    def _bypass(cls, values: list[str]) -> list[str]:
        try:
            proxyrules.parse_no_proxy(values)
        except proxyrules.ProxyConfigError as error:
            raise ValueError(str(error)) from None
        return values

    def egress(self) -> proxyrules.Egress | None:
        """The proxy deliveries go through, with its bypass; None without one."""
        proxy = self.proxy.get_secret_value() if self.proxy is not None else None
        return proxyrules.egress(proxy, self.no_proxy)

    # A hook that answered nothing but failures for this long is disabled until an operator
    # resumes it (docs/operators.md#pause-resume-and-auto-disable); unset: never.
    disable_after_hours: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @field_validator("user_agent")
    @classmethod
    def _header_value(cls, value: str) -> str:
        problem = header_value_problem(value)
        if problem is not None or value != value.strip():
            raise ValueError(problem or "may not begin or end with whitespace")
        return value

    @field_validator("allowed_networks")
    @classmethod
    def _cidrs(cls, values: list[str]) -> list[str]:
        bad = []
        for value in values:
            try:
                ipaddress.ip_network(value, strict=False)
            except ValueError:
                bad.append(value)
        if bad:
            raise ValueError(f"not a CIDR network: {', '.join(bad)}")
        return values

    @field_validator("ca_file")
    @classmethod
    def _readable(cls, value: str | None) -> str | None:
        if value is not None and not os.access(value, os.R_OK):
            raise ValueError(f"cannot read {value}")
        return value


class HookConfig(_Strict):
    # The URL schemes over which a client certificate is presented, and header names beside
    # RESERVED_HEADERS that a hook may not set (a broker hook's: BrokerHookConfig).
    _tls_schemes: ClassVar[tuple[str, ...]] = ("https",)
    _reserved_headers: ClassVar[frozenset[str]] = frozenset()

    url: str
    headers: dict[str, str] = Field(default_factory=dict)
    # mTLS: the private key of client_cert, when it is not in client_cert's file too. Declared
    # first, so that client_cert's check sees whether it was readable.
    client_key: str | None = None
    # A client certificate (PEM) efd presents to this hook.
    client_cert: str | None = Field(default=None, validate_default=True)
    _client: ClientCert | None = PrivateAttr(default=None)
    # The most requests a second efd sends this hook, across every daemon on the store, and
    # how many may go at once after a quiet spell (docs/delivery.md#rate-limits).
    max_per_second: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    burst: float | None = Field(default=None, ge=1, allow_inf_nan=False, validate_default=True)

    @field_validator("burst")
    @classmethod
    def _burst_with_a_limit(cls, burst: float | None, info: ValidationInfo) -> float | None:
        if burst is not None and info.data.get("max_per_second", 0) is None:
            raise ValueError("only a hook with max_per_second takes a burst")
        return burst

    def limit(self) -> tuple[float, float] | None:
        """(requests a second, burst) when the hook is rate-limited; the burst defaults to
        one second's worth, at least one request."""
        if self.max_per_second is None:
            return None
        burst = self.burst if self.burst is not None else max(1.0, self.max_per_second)
        return self.max_per_second, burst

    @field_validator("url")
    @classmethod
    def _full_http_url(cls, url: str) -> str:
        problem = netguard.http_url_problem(url)
        if problem is not None:
            raise ValueError(problem)
        return url

    @field_validator("headers")
    @classmethod
    def _valid_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        problems = []
        for name, value in headers.items():
            folded = name.strip().lower()
            if folded in RESERVED_HEADERS:
                problems.append(f"{name!r}: efd sets it (or it changes the request's framing)")
            elif folded in cls._reserved_headers:
                problems.append(f"{name!r}: the broker's header mechanism spends it on efd's own")
            elif not HEADER_NAME.fullmatch(name):
                problems.append(f"{name!r} is not a valid header name")
            elif (problem := header_value_problem(value)) is not None:
                problems.append(f"{name!r}: the value {problem}")
        if problems:
            raise ValueError("; ".join(problems))
        return headers

    @field_validator("client_key")
    @classmethod
    def _key_readable(cls, key: str | None) -> str | None:
        if key is not None and (problem := tls.unreadable(key)) is not None:
            raise ValueError(problem)
        return key

    @field_validator("client_cert")
    @classmethod
    def _certificate_and_key(cls, cert: str | None, info: ValidationInfo) -> str | None:
        if "client_key" not in info.data:
            return cert  # client_key's problem is reported; this one cannot be checked
        key = info.data["client_key"]
        if cert is None:
            if key is not None:
                raise ValueError("required with client_key: the certificate of that key")
            return None
        url = info.data.get("url")
        if url is not None and urlsplit(url).scheme not in cls._tls_schemes:
            raise ValueError(
                f"a client certificate is presented over {cls._tls_schemes[0]}:// only"
            )
        try:
            tls.check(cert, key)
        except tls.ClientCertError as error:
            raise ValueError(str(error)) from None
        return cert

    @model_validator(mode="after")
    def _client_cert(self) -> HookConfig:
        if self.client_cert is not None:
            try:  # what was checked above, with a digest of the files as they are now
                self._client = tls.check(self.client_cert, self.client_key)
            except tls.ClientCertError as error:
                raise ValueError(f"client_cert: {error}") from None
        return self

    @property
    def client(self) -> ClientCert | None:
        """The client certificate presented to this hook, as the configuration was loaded."""
        return self._client


# Every broker kind's keys beside url; a hook of one kind refuses the others by name.
BROKER_KEYS = tuple(dict.fromkeys(key for keys in broker_targets.KEYS.values() for key in keys))


def _broker_problems(kind: str, url: Any, keys: Mapping[str, Any]) -> list[str]:
    """efd.brokers.targets.parse_target's problems ("key: reason") for one hook."""
    try:
        broker_targets.parse_target(kind, url, keys)
    except BrokerConfigError as error:
        return list(error.problems)
    return []


def _placeholder_url(kind: str) -> str:
    return f"{broker_targets.SCHEMES[kind][0]}://efd.invalid"


class BrokerHookConfig(HookConfig):
    """A hook of a broker destination (type amqp, nats, redis_streams or mqtt: one subclass
    per kind): `url` is the broker's and the kind's keys say where it publishes
    (efd/brokers/targets.py, docs/brokers.md#keys). Each key is checked on its own, beside
    the others, so that every problem is reported in one pass."""

    kind: ClassVar[str]

    exchange: Any = Field(default=None, validate_default=True)
    routing_key: Any = Field(default=None, validate_default=True)
    subject: Any = Field(default=None, validate_default=True)
    stream: Any = Field(default=None, validate_default=True)
    maxlen: Any = Field(default=None, validate_default=True)
    topic: Any = Field(default=None, validate_default=True)
    qos: Any = Field(default=None, validate_default=True)
    _target: Target | None = PrivateAttr(default=None)

    @field_validator("url")
    @classmethod
    def _full_http_url(cls, url: str) -> str:
        # The URL's problems alone: the required name given a value that passes.
        required = broker_targets.REQUIRED[cls.kind]
        problems = _broker_problems(cls.kind, url, {required: "efd"})
        if problems:
            raise KeyedProblems(problems)
        return url

    @field_validator(*BROKER_KEYS)
    @classmethod
    def _broker_key(cls, value: Any, info: ValidationInfo) -> Any:
        key = info.field_name
        assert key is not None
        required = broker_targets.REQUIRED[cls.kind]
        # TOML has no null: None is a key not given.
        if value is None and key != required:
            return None
        keys = {} if value is None else {required: "efd", key: value}
        problems = [
            problem
            for problem in _broker_problems(cls.kind, _placeholder_url(cls.kind), keys)
            if problem.startswith(f"{key}:")
        ]
        if problems:
            raise KeyedProblems(problems)
        return value

    @model_validator(mode="after")
    def _parsed(self) -> BrokerHookConfig:
        keys = {key: getattr(self, key) for key in BROKER_KEYS if getattr(self, key) is not None}
        try:
            self._target = broker_targets.parse_target(self.kind, self.url, keys)
        except BrokerConfigError as error:
            raise KeyedProblems(error.problems) from None
        return self

    @property
    def target(self) -> Target:
        """Where this hook publishes, as parsed at load."""
        assert self._target is not None
        return self._target


def _broker_hook_class(kind: str) -> type[BrokerHookConfig]:
    tls_scheme = broker_targets.SCHEMES[kind][1]
    return type(
        f"{kind.title().replace('_', '')}HookConfig",
        (BrokerHookConfig,),
        {
            "__module__": __name__,
            "__annotations__": {},
            "kind": kind,
            "_tls_schemes": (tls_scheme,),
            "_reserved_headers": broker_headers.reserved_names(kind),
        },
    )


BROKER_HOOKS: dict[str, type[BrokerHookConfig]] = {
    kind: _broker_hook_class(kind) for kind in broker_targets.KINDS
}


def _hook_list(model: type[BrokerHookConfig]) -> TypeAdapter[list[BrokerHookConfig]]:
    return TypeAdapter(list[model])  # type: ignore[valid-type]


_BROKER_HOOK_LISTS = {kind: _hook_list(model) for kind, model in BROKER_HOOKS.items()}


# An action's auth table: its type -> the keys it takes (efd.delivery.outauth's records).
_AUTH_KEYS: dict[str, tuple[type[outauth.Auth], tuple[str, ...], tuple[str, ...]]] = {
    "bearer": (outauth.Bearer, ("token",), ()),
    "basic": (outauth.Basic, ("username", "password"), ()),
    "oauth2_client_credentials": (
        outauth.ClientCredentials,
        ("token_url", "client_id", "client_secret"),
        ("scope", "client_auth"),
    ),
}


def auth_record(table: Any) -> outauth.Auth:
    """An action's `auth` table as its outauth record; KeyedProblems names each bad key
    (never a value: they are secrets)."""
    if not isinstance(table, dict):
        raise KeyedProblems(["auth: must be a table with a type"])
    kind = table.get("type")
    if kind not in _AUTH_KEYS:
        raise KeyedProblems([f"auth.type: must be one of {', '.join(map(repr, _AUTH_KEYS))}"])
    record, required, optional = _AUTH_KEYS[kind]
    problems = [f"auth.{key}: required" for key in required if key not in table]
    problems += [
        f"auth.{key}: unknown key for type {kind!r}"
        for key in table
        if key != "type" and key not in required + optional
    ]
    if problems:
        raise KeyedProblems(problems)
    try:
        return record(**{key: value for key, value in table.items() if key != "type"})
    except outauth.AuthConfigError as error:
        # "<type>.<key>: why": the key is named from the action's auth table.
        raise KeyedProblems([f"auth.{str(error).split('.', 1)[1]}"]) from None


def _request_problems(**keys: Any) -> None:
    """compile_request's problems with the keys given (the others left at valid values)."""
    try:
        actions.compile_request(
            **{"url": "https://efd.invalid/", **keys}, url_problem=netguard.http_url_problem
        )
    except actions.ActionRequestError as error:
        raise KeyedProblems(error.problems) from None


def _whole_message() -> Any:
    return {"@path": "$."}


def auth_conflicts(action: Mapping[str, Any]) -> list[str]:
    """An action with `auth` sends that Authorization and no other: none among its headers,
    no credentials in its URL (which efd would send as Basic in its place). Keys from the
    action; on plain data, so the load's cross-entry pass reports it too."""
    if action.get("auth") is None:
        return []
    problems = []
    headers = action.get("headers")
    if isinstance(headers, Mapping):
        problems += [
            f"headers.{name}: set by auth; give one or the other"
            for name in headers
            if isinstance(name, str) and name.lower() == "authorization"
        ]
    url = action.get("url")
    if isinstance(url, str) and "@" in urlsplit(url.split("{{", 1)[0]).netloc:
        problems.append("url: holds credentials, and auth gives them; give one or the other")
    return problems


def batch_problems(action: Mapping[str, Any]) -> list[str]:
    """Every problem of an action's batch keys (efd.delivery.batching.policy_problems), keys
    from the action; on plain data, so the load's cross-entry pass reports them too."""
    content_type = action.get("content_type", batching.JSON)
    problems = batching.policy_problems(
        action, content_type=content_type if isinstance(content_type, str) else batching.JSON
    )
    return problems


class ActionConfig(HookConfig):
    """One action of an actions destination (docs/actions.md): a hook whose URL may hold
    `{{field}}` templates, with its trigger, method, body type, mapping and auth."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    name: str = Field(min_length=1, max_length=100)
    trigger: str
    method: str = "POST"
    content_type: str = actions.JSON
    auth: dict[str, Any] | None = None
    # A mapping (a table, or its JSON text); the default sends the whole message.
    data: Any = Field(default_factory=_whole_message)
    # Batched delivery (docs/actions.md#batches): as written, checked together by
    # efd.delivery.batching (which names each problem by key), and read as `batch`.
    batch_size: Any = 1
    batch_max_bytes: Any = batching.MAX_BYTES_DEFAULT
    batch_wait_seconds: Any = batching.WAIT_DEFAULT
    batch_keys: Any = Field(default_factory=lambda: list(batching.KEYS))
    batch_signature: Any = batching.BODY
    _request: actions.ActionRequest | None = PrivateAttr(default=None)
    _batch: batching.BatchPolicy = PrivateAttr(default_factory=batching.BatchPolicy)
    _auth: outauth.Auth | None = PrivateAttr(default=None)

    # The URL and headers follow an action request's rules (templates in the path and query;
    # Content-Type comes from content_type), not a hook's.
    @field_validator("url")
    @classmethod
    def _full_http_url(cls, url: str) -> str:
        _request_problems(url=url)
        return url

    @field_validator("headers")
    @classmethod
    def _valid_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        _request_problems(headers=headers)
        return headers

    @field_validator("name")
    @classmethod
    def _route_name(cls, name: str) -> str:
        if "/" in name:
            raise ValueError('may not contain "/" (the route is named destination/action)')
        if name != name.strip() or any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
            raise ValueError("may not begin or end with whitespace or hold control characters")
        return name

    @field_validator("trigger")
    @classmethod
    def _parses(cls, text: str) -> str:
        try:
            triggers.parse(text)
        except triggers.TriggerError as error:
            raise ValueError(str(error)) from None
        return text

    @field_validator("method")
    @classmethod
    def _method(cls, method: str) -> str:
        _request_problems(method=method)
        return method

    @field_validator("content_type")
    @classmethod
    def _content_type(cls, content_type: str) -> str:
        _request_problems(content_type=content_type)
        return content_type

    @field_validator("auth")
    @classmethod
    def _auth_record(cls, table: dict[str, Any] | None) -> dict[str, Any] | None:
        if table is not None:
            auth_record(table)
        return table

    @field_validator("data")
    @classmethod
    def _mapping(cls, data: Any) -> Any:
        try:
            mapping.compile(data, name="data")
        except mapping.MappingError as error:
            raise KeyedProblems(error.problems) from None
        return data

    @model_validator(mode="after")
    def _compiled(self) -> ActionConfig:
        if self.auth is not None:
            conflicts = auth_conflicts(
                {"auth": self.auth, "headers": self.headers, "url": self.url}
            )
            if conflicts:
                raise KeyedProblems(conflicts)
            self._auth = auth_record(self.auth)
        self._request = actions.compile_request(
            url=self.url,
            method=self.method,
            headers=self.headers,
            content_type=self.content_type,
            url_problem=netguard.http_url_problem,
        )
        return self

    @model_validator(mode="after")
    def _batch_policy(self) -> ActionConfig:
        # Also in efd.config.checks, which reports it beside any other problem of the file.
        keys = {key: getattr(self, key) for key in batching.CONFIG_KEYS}
        problems = batch_problems({**keys, "content_type": self.content_type})
        if problems:
            raise KeyedProblems(problems)
        self._batch = batching.policy(keys, content_type=self.content_type)
        return self

    @property
    def batch(self) -> batching.BatchPolicy:
        """How the action batches its events (size 1: one event a request)."""
        return self._batch

    def action(self, route: str) -> Action:
        """The action as routing runs it, under its route's name."""
        assert self._request is not None
        return Action(
            name=self.name,
            route=route,
            trigger=triggers.parse(self.trigger),
            mapping=mapping.compile(self.data, name="data"),
            request=self._request,
        )

    @property
    def outbound_auth(self) -> outauth.Auth | None:
        return self._auth


def _field_paths(paths: list[str]) -> list[str]:
    problems = []
    for index, path in enumerate(paths):
        try:
            parse_field_path(path)
        except ValueError as error:
            problems.append(f"[{index}] {error}")
    if problems:
        raise ValueError("; ".join(problems))
    return paths


FieldPaths = Annotated[list[str], AfterValidator(_field_paths)]


class FieldsConfig(_Strict):
    """The fields a drop_fields or allow_fields filter names, by the object they are in."""

    properties: FieldPaths | None = None
    context: FieldPaths | None = None
    traits: FieldPaths | None = None

    @model_validator(mode="after")
    def _names_an_object(self) -> FieldsConfig:
        if self.properties is None and self.context is None and self.traits is None:
            raise ValueError("name the fields of at least one of properties, context, traits")
        return self

    def paths(self) -> tuple[tuple[str, tuple[tuple[str, ...], ...]], ...]:
        named = (("properties", self.properties), ("context", self.context))
        return tuple(
            (name, tuple(parse_field_path(path) for path in paths))
            for name, paths in (*named, ("traits", self.traits))
            if paths is not None
        )


def _condition(value: Any) -> Condition:
    if isinstance(value, Condition):
        return value
    if not isinstance(value, str):
        raise ValueError('must be a string: an FQL expression, or "all"')
    try:
        return Condition(value)
    except FqlError as error:
        raise ValueError(str(error)) from None


FilterAction = Literal["drop", "sample", "drop_fields", "allow_fields"]
_FIELD_ACTIONS = ("drop_fields", "allow_fields")


class FilterConfig(_Strict):
    """One of a destination's filters (docs/filters.md); the expression is parsed here, once."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    when: Annotated[
        Condition,
        BeforeValidator(_condition),
        PlainSerializer(lambda condition: condition.source, return_type=str),
    ] = Field(alias="if")
    action: FilterAction
    # Declared after `action`, and validated when absent too, so each can check the action.
    percent: float | None = Field(
        default=None, ge=0, le=100, strict=True, allow_inf_nan=False, validate_default=True
    )
    fields: FieldsConfig | None = Field(default=None, validate_default=True)

    @field_validator("percent")
    @classmethod
    def _percent_for_sample(cls, percent: float | None, info: ValidationInfo) -> float | None:
        action = info.data.get("action")
        if action == "sample" and percent is None:
            raise ValueError('required with action = "sample" (0 to 100)')
        if action is not None and action != "sample" and percent is not None:
            raise ValueError(f'only a sample filter takes a percent, not action = "{action}"')
        return percent

    @field_validator("fields")
    @classmethod
    def _fields_for_field_actions(
        cls, fields: FieldsConfig | None, info: ValidationInfo
    ) -> FieldsConfig | None:
        action = info.data.get("action")
        if action in _FIELD_ACTIONS and fields is None:
            raise ValueError(
                f'required with action = "{action}", e.g. fields = {{ properties = ["email"] }}'
            )
        if action is not None and action not in _FIELD_ACTIONS and fields is not None:
            raise ValueError(
                f'only drop_fields and allow_fields filters take fields, not action = "{action}"'
            )
        return fields

    def rule(self) -> Filter:
        return Filter(
            when=self.when,
            action=self.action,
            percent=self.percent,
            fields=() if self.fields is None else self.fields.paths(),
        )


Signing = Literal["x-signature", "standard-webhooks"]


def _x_signature() -> list[Signing]:
    return ["x-signature"]


class DestinationConfig(_Strict):
    name: str = Field(min_length=1)
    # "webhooks": Segment's classic body to every hook; "actions": each action's own request
    # (docs/actions.md); a broker's kind: the webhook's body and headers published to each
    # hook's broker (docs/brokers.md).
    type: Literal["webhooks", "actions", "amqp", "nats", "redis_streams", "mqtt"] = "webhooks"
    shared_secret: SecretStr | None = None
    # How each request is signed: Segment's X-Signature (with shared_secret), Standard
    # Webhooks (with standard_webhooks_secrets), or both.
    signing: list[Signing] = Field(default_factory=_x_signature, min_length=1)
    # Every listed secret signs each request: the first is current, the others stay while
    # receivers move over to it (rotation).
    standard_webhooks_secrets: list[SecretStr] = Field(default_factory=list)
    # A webhooks or broker destination's (1 to MAX_HOOKS: efd.config.checks), none on an
    # actions one. A broker destination's are BrokerHookConfig of its kind (_hooks_of_type).
    hooks: list[HookConfig] = Field(default_factory=list, max_length=MAX_HOOKS)
    # An actions destination's (1 to MAX_ACTIONS), none on a webhooks one.
    actions: list[ActionConfig] = Field(default_factory=list, max_length=MAX_ACTIONS)
    # Applied in Segment's order (sample, drop, drop_fields, allow_fields): docs/filters.md.
    filters: list[FilterConfig] = Field(default_factory=list)
    # "per_user": each user's messages go one at a time, in the order efd acknowledged them
    # (docs/delivery.md, "Ordered delivery"); "none": each on its own.
    ordering: Ordering = Ordering.NONE

    @field_validator("hooks", mode="wrap")
    @classmethod
    def _hooks_of_type(
        cls, hooks: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> list[HookConfig]:
        # The hooks' keys depend on the destination's type, declared (and validated) first.
        adapter = _BROKER_HOOK_LISTS.get(info.data.get("type", ""))
        if adapter is None:
            hooks = handler(hooks)
            assert isinstance(hooks, list)
            return hooks
        if isinstance(hooks, list) and len(hooks) > MAX_HOOKS:
            raise ValueError(f"at most {MAX_HOOKS} hooks")
        return list(adapter.validate_python(hooks))

    @field_validator("signing")
    @classmethod
    def _no_repeats(cls, signing: list[Signing]) -> list[Signing]:
        if len(set(signing)) != len(signing):
            raise ValueError("lists a scheme twice")
        return signing

    @field_validator("standard_webhooks_secrets")
    @classmethod
    def _whsec(cls, secrets: list[SecretStr]) -> list[SecretStr]:
        problems = []
        for index, secret in enumerate(secrets):
            try:
                standard_secret(secret.get_secret_value())
            except ValueError as error:
                problems.append(f"[{index}] {error}")  # never the secret itself
        if problems:
            raise ValueError("; ".join(problems))
        return secrets

    @model_validator(mode="after")
    def _secrets_for_signing(self) -> DestinationConfig:
        if "standard-webhooks" in self.signing and not self.standard_webhooks_secrets:
            raise ValueError(
                "signing lists standard-webhooks: standard_webhooks_secrets needs at least "
                "one whsec_ secret"
            )
        return self

    @model_validator(mode="after")
    def _hooks_or_actions(self) -> DestinationConfig:
        # Also in efd.config.checks, which reports it beside any other problem of the file.
        if self.type != "actions" and not self.hooks:
            raise KeyedProblems([f"hooks: a {self.type} destination needs at least 1 hook"])
        if self.type == "actions" and not self.actions:
            raise KeyedProblems(["actions: an actions destination needs 1 to 5 actions"])
        return self

    def route_name(self, action: ActionConfig) -> str:
        return f"{self.name}/{action.name}"

    def route_names(self) -> tuple[str, ...]:
        """The names its deliveries are stored and claimed under: its own, or one per action."""
        if self.type == "actions":
            return tuple(self.route_name(action) for action in self.actions)
        return (self.name,)

    def route_hooks(self) -> tuple[tuple[str, tuple[HookConfig, ...]], ...]:
        """Each route's name and the hooks it sends to: the destination's, or each action
        alone (an action is its route's one hook)."""
        if self.type == "actions":
            return tuple((self.route_name(a), (a,)) for a in self.actions)
        return ((self.name, tuple(self.hooks)),)

    @property
    def broker(self) -> bool:
        """Whether its hooks are brokers (type amqp, nats, redis_streams or mqtt)."""
        return self.type in BROKER_HOOKS

    def targets(self) -> dict[str, Target]:
        """A broker destination's hook URLs -> where each publishes; none for the others.
        A URL given twice publishes where its first hook says (the URL is the hook's
        identity for circuits, rate limits and attempts)."""
        found: dict[str, Target] = {}
        for hook in self.hooks:
            if isinstance(hook, BrokerHookConfig):
                found.setdefault(hook.url, hook.target)
        return found

    def action_set(self) -> ActionSet:
        """Its actions as routing runs them (an actions destination's only)."""
        return ActionSet(self.name, tuple(a.action(self.route_name(a)) for a in self.actions))

    def filter_set(self) -> FilterSet:
        """The destination's filters, ready to apply (their expressions are already parsed)."""
        return FilterSet([f.rule() for f in self.filters])

    def buckets(self) -> tuple[ratelimit.Bucket, ...]:
        """The token buckets of the destination's rate-limited hooks (none: unlimited)."""
        return ratelimit.buckets(self.name, [(hook.url, hook.limit()) for hook in self.hooks])

    def route_buckets(self) -> dict[str, tuple[ratelimit.Bucket, ...]]:
        """Route name -> the token buckets of its rate-limited hooks, for routes that have some."""
        if self.type != "actions":
            found = self.buckets()
            return {self.name: found} if found else {}
        named = ((self.route_name(a), a) for a in self.actions)
        return {
            route: found
            for route, a in named
            if (found := ratelimit.buckets(route, [(a.url, a.limit())]))
        }

    def routes(self, user_agent: str) -> tuple[Route, ...]:
        """What the dispatcher claims and sends for: a webhooks destination is one route, an
        actions destination one per action, named destination/action, whose one hook is the
        action's URL as configured (its identity for circuits, rate limits and attempts)."""
        if self.type != "actions":
            return (self.route(user_agent),)
        return tuple(
            self._route(
                self.route_name(a),
                ((a.url, a),),
                user_agent,
                method=a.method,
                content_type=a.content_type,
                action=True,
            )
            for a in self.actions
        )

    def auths(self) -> dict[str, outauth.Auth]:
        """Route name -> the outbound auth its requests carry; a webhook route has none."""
        return {
            self.route_name(a): a.outbound_auth for a in self.actions if a.outbound_auth is not None
        }

    def route(self, user_agent: str) -> Route:
        return self._route(self.name, tuple((hook.url, hook) for hook in self.hooks), user_agent)

    def _route(
        self,
        name: str,
        hooks: tuple[tuple[str, HookConfig], ...],
        user_agent: str,
        *,
        method: str = "POST",
        content_type: str = "application/json",
        action: bool = False,
    ) -> Route:
        secret = self.shared_secret.get_secret_value() if self.shared_secret else None
        keys = tuple(standard_secret(s.get_secret_value()) for s in self.standard_webhooks_secrets)
        return Route(
            name=name,
            hooks=tuple((url, dict(hook.headers)) for url, hook in hooks),
            client_certs={url: hook.client for url, hook in hooks if hook.client},
            secret=(secret or None) if "x-signature" in self.signing else None,
            user_agent=user_agent,
            standard_secrets=keys if "standard-webhooks" in self.signing else (),
            method=method,
            content_type=content_type,
            action=action,
        )


class SourceConfig(_Strict):
    name: str = Field(min_length=1)
    write_key: SecretStr
    destinations: list[str] = Field(default_factory=list)
    # Origins whose web pages may send with this key (efd.http.cors); None: any origin.
    allowed_origins: list[Annotated[str, AfterValidator(check_pattern)]] | None = None

    @field_validator("write_key")
    @classmethod
    def _non_empty(cls, key: SecretStr) -> SecretStr:
        if not key.get_secret_value():
            raise ValueError("may not be empty")
        return key


class _ComputationConfig(_Strict):
    name: str = Field(min_length=1)
    destinations: list[str] = Field(min_length=1)
    sync_interval_seconds: Seconds = 3600

    @field_validator("name")
    @classmethod
    def _has_key(cls, name: str) -> str:
        if not snake_case(name):
            raise ValueError("must contain a letter or a digit (it becomes a trait name)")
        return name

    @property
    def key(self) -> str:
        """The trait it is delivered as: the snake_case form of its name."""
        return snake_case(self.name)


class AudienceConfig(_ComputationConfig):
    condition: str

    @field_validator("condition")
    @classmethod
    def _parses(cls, text: str) -> str:
        try:
            parse_condition(text)
        except ParseError as error:
            raise ValueError(str(error)) from None
        return text


class ComputedTraitConfig(_ComputationConfig):
    expression: str

    @field_validator("expression")
    @classmethod
    def _parses(cls, text: str) -> str:
        try:
            parse_expression(text)
        except ParseError as error:
            raise ValueError(str(error)) from None
        return text


class LoggingConfig(_Strict):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["text", "json"] = "text"


class OperationsConfig(_Strict):
    """efd's own events (docs/operators.md#operational-events), sent to `destination`."""

    destination: str = Field(min_length=1)
    # backlog.high: a destination's pending deliveries, or its oldest pending one's age.
    backlog_high: int = Field(default=10000, ge=1)
    oldest_pending_high_seconds: Seconds = 3600
    # lane.blocked: an ordered lane waiting this long on a head that failed.
    lane_blocked_seconds: Seconds = 600
    # At most this many events a minute per process; the rest are counted in one summary.
    max_events_per_minute: int = Field(default=60, ge=1, le=100000)
    # How often the backlogs and lanes are looked at.
    check_interval_seconds: Seconds = 60


class TelemetryConfig(_Strict):
    """OpenTelemetry traces (docs/telemetry.md): off until `otlp_endpoint` is set."""

    # Where spans are sent, by OTLP over HTTP with protobuf: the collector's full traces URL
    # (http://127.0.0.1:4318/v1/traces). Set by the operator like the database's URL, so
    # delivery's address guard, which is there for receivers' URLs, does not apply to it.
    otlp_endpoint: str | None = None
    service_name: str = Field(default="efd", min_length=1, max_length=200)
    # The share of traces efd starts that are recorded; a request's traceparent that says
    # sampled (or not) decides for its own trace.
    sampling_ratio: float = Field(default=1.0, ge=0, le=1)

    @field_validator("otlp_endpoint")
    @classmethod
    def _collector_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises for a port that is not a number
        except ValueError as error:
            raise ValueError(f"not a URL: {error}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        if parts.username is not None or parts.password is not None:
            raise ValueError("may not hold credentials")
        return url

    @property
    def enabled(self) -> bool:
        return self.otlp_endpoint is not None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="EFD_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    server: ServerConfig = ServerConfig()
    storage: StorageConfig = StorageConfig()
    delivery: DeliveryConfig = DeliveryConfig()
    logging: LoggingConfig = LoggingConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    sources: list[SourceConfig] = Field(default_factory=list)
    destinations: list[DestinationConfig] = Field(default_factory=list)
    audiences: list[AudienceConfig] = Field(default_factory=list)
    computed_traits: list[ComputedTraitConfig] = Field(default_factory=list)
    operations: OperationsConfig | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Earlier sources win: init (tests), then the environment, then the file (load()
        # adds it, from what it read).
        return (init_settings, env_settings)

    @model_validator(mode="after")
    def _operations_destination(self) -> Settings:
        # The events' source name is reserved while they are sent.
        if self.operations is None:
            return self
        problems = []
        name = self.operations.destination
        if name not in {d.name for d in self.destinations}:
            problems.append(f"operations.destination: no destination named {name!r}")
        for i, source in enumerate(self.sources):
            if source.name == OPERATIONS_SOURCE:
                problems.append(
                    f"sources[{i}].name: {OPERATIONS_SOURCE!r} is reserved for efd's operational "
                    "events while [operations] is configured"
                )
        if problems:
            raise KeyedProblems(problems)
        return self

    def helpers(self, cpus: int) -> tuple[int, int]:
        """(parser, sender) processes for a daemon that may keep `cpus` CPUs busy (its
        affinity, narrowed by a CPU quota): as set, else one each, or none on one CPU, where a
        child could only take turns with the daemon and its pipe would cost CPU of its own."""
        default = 1 if cpus > 1 else 0
        parse, send = self.server.parse_processes, self.delivery.sender_processes
        return (default if parse is None else parse, default if send is None else send)

    def filter_sets(self) -> dict[str, FilterSet]:
        """Destination -> its filters, for the destinations that have some (routing.shape
        costs nothing when this is empty)."""
        return {d.name: d.filter_set() for d in self.destinations if d.filters}

    def action_sets(self) -> dict[str, ActionSet]:
        """Destination -> its actions, for the actions destinations (routing.shape)."""
        return {d.name: d.action_set() for d in self.destinations if d.type == "actions"}

    def ordered(self) -> frozenset[str]:
        """The routes that deliver in order per user (`ordering = "per_user"`): a
        destination's, or each of its actions'."""
        return frozenset(
            name
            for d in self.destinations
            if d.ordering is Ordering.PER_USER
            for name in d.route_names()
        )

    def route_names(self) -> set[str]:
        """The names a configured destination's deliveries are stored under: each route's
        (claimed and sent), and an actions destination's own (its `filtered` rows)."""
        return {name for d in self.destinations for name in (d.name, *d.route_names())}

    def route_buckets(self) -> dict[str, tuple[ratelimit.Bucket, ...]]:
        """Route -> its rate-limited hooks' token buckets, for the routes that have some."""
        return {k: v for d in self.destinations for k, v in d.route_buckets().items()}

    def broker_targets(self) -> dict[str, dict[str, Target]]:
        """Route -> its hook URLs' broker targets, for the broker destinations (the sender
        publishes their rounds instead of POSTing them)."""
        return {d.name: d.targets() for d in self.destinations if d.broker}

    def destination(self, name: str) -> DestinationConfig:
        for destination in self.destinations:
            if destination.name == name:
                return destination
        raise KeyError(name)
