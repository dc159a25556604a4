"""A mapping's load: every directive checked, with every problem named by its key path, and
the mapping turned into closures over a message (pure). `apply` runs them.

Each `_build_*` method takes a directive's argument and the path to it, records what is
wrong with it, and returns the closure that computes its value from the current payload.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from efd import jsonjs
from efd.languages.mapping import directives as do
from efd.languages.mapping.template import compiled as compiled_template
from efd.languages.mapping.template import render
from efd.languages.mapping.values import (
    UNDEFINED,
    MappingError,
    fail,
    finish,
    get,
    kind,
    loosely_empty,
    parse_path,
    truthy,
    utf16_length,
)
from efd.languages.toolkit import MAX_DEPTH

Fn = Callable[[Any], Any]
Path = tuple[str | int, ...]

DIRECTIVES: Final = (
    "@path",
    "@template",
    "@if",
    "@literal",
    "@arrayPath",
    "@case",
    "@replace",
    "@merge",
    "@transform",
    "@flatten",
    "@json",
    "@excludeWhenNull",
)
# The directives whose values are made only of the message's values, strings, and the
# mapping's own constants: on a plain message (efd.jsonjs.loads_checked) their result is plain
# when those constants are. @flatten makes keys and @json decodes values of its own.
_KEEPS_PLAIN: Final = frozenset(DIRECTIVES) - {"@flatten", "@json"}
# The kit's length limits for @replace's texts.
MAX_PATTERN: Final = 10


def _nothing(payload: Any) -> Any:
    return UNDEFINED


def _const(value: Any) -> Fn:
    return lambda payload: value


def _quoted(names: Sequence[str]) -> str:
    return ", ".join(f'"{name}"' for name in names)


@dataclass(frozen=True)
class Mapping:
    """A compiled mapping: `source` as it was given, `name` the key path its errors start
    with; `plain`: its value for a plain message is plain too, so it may be written with
    efd.jsonjs.dumps(plain=True)."""

    source: Any
    name: str
    run: Fn
    plain: bool = False

    def apply(self, payload: Any) -> Any:
        return apply(self, payload)

    def __reduce__(self) -> tuple[Callable[..., Mapping], tuple[Any, str]]:
        # Its closures do not pickle: a parser process compiles the source again.
        return _compiled, (self.source, self.name)


def compile(mapping: Any, *, name: str = "data") -> Mapping:
    """Compile a mapping (a JSON-like value, or its JSON text); MappingError lists every
    problem, each naming its key path from `name`."""
    if isinstance(mapping, str):
        try:
            mapping = jsonjs.loads(mapping)
        except ValueError as error:
            raise MappingError([f"{name}: the mapping is not valid JSON ({error})"]) from None
    compiler = _Compiler()
    run = compiler.root(mapping, (name,))
    if compiler.problems:
        raise MappingError(compiler.problems)
    return Mapping(mapping, name, run, _keeps_plain(mapping))


def _keeps_plain(node: Any) -> bool:
    """Whether every directive of `node` keeps a plain message's values plain and every
    constant in it (an object's key, a literal, an option) is plain itself."""
    if isinstance(node, dict):
        for key, value in node.items():
            if str(key).startswith("@") and key not in _KEEPS_PLAIN:
                return False
            if jsonjs.is_array_index(key) or not _keeps_plain(value):
                return False
        return True
    if isinstance(node, list):
        return all(_keeps_plain(item) for item in node)
    return jsonjs.plain_value(node)


def _compiled(source: Any, name: str) -> Mapping:
    return compile(source, name=name)


def apply(compiled: Mapping, payload: Any) -> Any:
    """The mapped value for a message; MappingError says why there is none."""
    if not isinstance(payload, dict):
        raise fail(compiled.name, f"the message must be an object, and it is {kind(payload)}")
    try:
        value = finish(compiled.run(payload))
    except RecursionError:
        raise fail(compiled.name, "the message is nested too deeply to map") from None
    if value is UNDEFINED:
        raise fail(compiled.name, "the mapping gives no value for this message")
    return value


class _Compiler:
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.depth = 0
        self.too_deep = False

    def problem(self, path: Path, reason: str) -> Fn:
        self.problems.append(f"{jsonjs.field_name(path)}: {reason}")
        return _nothing

    def root(self, mapping: Any, path: Path) -> Fn:
        if not isinstance(mapping, dict):
            return self.problem(path, f"the mapping must be an object, and it is {kind(mapping)}")
        return self.value(mapping, path)

    def value(self, node: Any, path: Path) -> Fn:
        """Any part of a mapping: a directive, an object or array of parts, or a constant."""
        if self.depth >= MAX_DEPTH:
            if not self.too_deep:
                self.too_deep = True
                self.problem(path, f"the mapping is nested more than {MAX_DEPTH} levels deep")
            return _nothing
        self.depth += 1
        try:
            return self._value(node, path)
        finally:
            self.depth -= 1

    def _value(self, node: Any, path: Path) -> Fn:
        if isinstance(node, dict):
            names = [key for key in node if isinstance(key, str) and key.startswith("@")]
            if names:
                return self.directive(node, names, path)
            fields = [(key, self.value(item, (*path, key))) for key, item in node.items()]
            return lambda payload: {key: fn(payload) for key, fn in fields}
        if isinstance(node, list | tuple):
            items = [self.value(item, (*path, i)) for i, item in enumerate(node)]
            return lambda payload: [fn(payload) for fn in items]
        if isinstance(node, float) and not math.isfinite(node):
            return self.problem(path, "a number must be finite")
        if node is None or isinstance(node, str | int | float):
            return _const(node)
        return self.problem(path, f"{type(node).__name__} is not a JSON value")

    def directive(self, node: dict[str, Any], names: list[str], path: Path) -> Fn:
        if len(names) > 1:
            return self.problem(
                path, f"an object holds one directive, and this one has {', '.join(names)}"
            )
        name = names[0]
        others = [str(key) for key in node if key != name and key != "_metadata"]
        if others:
            return self.problem(
                path,
                f"{name} cannot stand beside other keys ({', '.join(others)}); "
                "give the directive a key of its own",
            )
        here = (*path, name)
        if name == "@liquid":
            return self.problem(
                here,
                "@liquid is not supported; build the value with @template and the other directives",
            )
        if name not in DIRECTIVES:
            return self.problem(
                path, f"unknown directive {name}; the directives are {', '.join(DIRECTIVES)}"
            )
        build: Callable[[Any, Path], Fn] = getattr(self, "_build_" + name[1:].lower())
        return build(node[name], here)

    # -- what the directives take

    def options(
        self, arg: Any, path: Path, required: tuple[str, ...], optional: tuple[str, ...]
    ) -> dict[str, Any] | None:
        """A directive's object of options, checked for unknown and missing keys."""
        name = str(path[-1])
        known = required + optional
        if not isinstance(arg, dict) or any(str(key).startswith("@") for key in arg):
            given = "a directive" if isinstance(arg, dict) else kind(arg)
            self.problem(
                path,
                f"{name} takes an object with the keys {_quoted(known)}, not {given}",
            )
            return None
        for key in arg:
            if key not in known:
                self.problem((*path, key), f"{name} has no such key; its keys are {_quoted(known)}")
        for key in required:
            if key not in arg:
                self.problem(path, f'{name} needs "{key}"')
        return arg

    def text(self, arg: Any, path: Path, what: str, *, checked: bool = True) -> str | Fn | None:
        """A string, or a directive whose value must be one when `checked` (when it runs)."""
        if isinstance(arg, str):
            return arg
        if isinstance(arg, dict) and any(str(key).startswith("@") for key in arg):
            fn = self.value(arg, path)
            if not checked:
                return fn
            where = jsonjs.field_name(path)

            def run(payload: Any) -> str:
                value = fn(payload)
                if not isinstance(value, str):
                    raise fail(
                        where, f"{what} must be a string, and its directive gave {kind(value)}"
                    )
                return value

            return run
        self.problem(path, f"{what} must be a string or a directive, not {kind(arg)}")
        return None

    def string(
        self, opts: dict[str, Any], key: str, path: Path, *, most: int | None = None, least: int = 0
    ) -> str | None:
        if key not in opts:
            return None
        value = opts[key]
        if not isinstance(value, str):
            self.problem((*path, key), f"the {key} must be a string, not {kind(value)}")
            return None
        if most is not None and not least <= utf16_length(value) <= most:
            self.problem((*path, key), f"the {key} must be {least} to {most} characters long")
        return value

    def choice(
        self, opts: dict[str, Any], key: str, path: Path, allowed: tuple[str, str]
    ) -> str | None:
        value = opts.get(key)
        if key in opts and value not in allowed:
            self.problem((*path, key), f'the {key} must be "{allowed[0]}" or "{allowed[1]}"')
        return value if value in allowed else None

    def boolean(self, opts: dict[str, Any], key: str, path: Path, default: bool) -> bool:
        value = opts.get(key, default)
        if not isinstance(value, bool):
            self.problem((*path, key), f"the {key} must be true or false, not {kind(value)}")
            return default
        return value

    def shape(self, arg: Any, path: Path, what: str) -> Fn:
        """An object or a directive."""
        if not isinstance(arg, dict):
            return self.problem(path, f"{what} must be an object or a directive, not {kind(arg)}")
        return self.value(arg, path)

    # -- the directives

    def _build_path(self, arg: Any, path: Path) -> Fn:
        text = self.text(arg, path, "the path")
        if text is None:
            return _nothing
        if isinstance(text, str):
            keys = parse_path(text)
            return lambda payload: get(payload, keys)
        fn = text
        return lambda payload: get(payload, parse_path(fn(payload)))

    def _build_template(self, arg: Any, path: Path) -> Fn:
        text = self.text(arg, path, "the template")
        if text is None:
            return _nothing
        if isinstance(text, str):
            return compiled_template(text)
        fn = text
        return lambda payload: render(fn(payload), payload)

    def _build_literal(self, arg: Any, path: Path) -> Fn:
        return self.value(arg, path)

    def _build_if(self, arg: Any, path: Path) -> Fn:
        opts = self.options(arg, path, (), ("exists", "blank", "then", "else"))
        if opts is None:
            return _nothing
        if not truthy(opts.get("exists")) and not truthy(opts.get("blank")):
            return self.problem(
                path, '@if needs "exists" or "blank", with a value other than false, 0, "" or null'
            )
        blank = "exists" not in opts
        test = self.value(
            opts["blank" if blank else "exists"], (*path, "blank" if blank else "exists")
        )
        then = self.value(opts["then"], (*path, "then")) if "then" in opts else _nothing
        # The kit takes an "else" only when it is truthy: false, 0, "" or null give nothing.
        otherwise = (
            self.value(opts["else"], (*path, "else")) if truthy(opts.get("else")) else _nothing
        )

        def run(payload: Any) -> Any:
            value = test(payload)
            holds = value is not UNDEFINED and value is not None
            if holds and blank:
                holds = not loosely_empty(value)
            return then(payload) if holds else otherwise(payload)

        return run

    def _build_arraypath(self, arg: Any, path: Path) -> Fn:
        if not isinstance(arg, list) or len(arg) not in (1, 2):
            return self.problem(
                path, f"@arrayPath takes an array [path, item mapping], not {kind(arg)}"
            )
        root: Fn
        if isinstance(arg[0], str):
            keys = parse_path(arg[0])
            root = lambda payload: get(payload, keys)  # noqa: E731
        elif isinstance(arg[0], dict) and any(str(key).startswith("@") for key in arg[0]):
            root = self.value(arg[0], (*path, 0))
        else:
            return self.problem(
                (*path, 0), f"the path must be a string or a directive, not {kind(arg[0])}"
            )
        if len(arg) == 1 or arg[1] == {}:
            return root
        item = self.shape(arg[1], (*path, 1), "the item mapping")

        def run(payload: Any) -> Any:
            found = root(payload)
            if isinstance(found, dict):
                return [item(found)]
            if isinstance(found, list):
                return [item(each) for each in found]
            return found

        return run

    def _build_case(self, arg: Any, path: Path) -> Fn:
        opts = self.options(arg, path, ("operator",), ("value",))
        if opts is None:
            return _nothing
        operator = self.choice(opts, "operator", path, ("lower", "upper"))
        text = (
            self.text(opts["value"], (*path, "value"), "the value", checked=False)
            if "value" in opts
            else ""
        )
        if not text or operator is None:
            return _nothing

        def change(value: Any) -> Any:
            if not isinstance(value, str):
                return value
            return value.lower() if operator == "lower" else value.upper()

        if isinstance(text, str):
            return _const(change(text))
        fn = text
        return lambda payload: change(fn(payload))

    def _build_replace(self, arg: Any, path: Path) -> Fn:
        keys = ("replacement", "ignorecase", "global", "pattern2", "replacement2")
        opts = self.options(arg, path, ("pattern", "value"), keys)
        if opts is None:
            return _nothing
        pattern = self.string(opts, "pattern", path, least=1, most=MAX_PATTERN)
        replacement = self.string(opts, "replacement", path, most=MAX_PATTERN) or ""
        pattern2 = self.string(opts, "pattern2", path, most=MAX_PATTERN)
        replacement2 = self.string(opts, "replacement2", path, most=MAX_PATTERN) or ""
        ignorecase = self.boolean(opts, "ignorecase", path, False)
        every = self.boolean(opts, "global", path, True)
        text = (
            self.text(opts["value"], (*path, "value"), "the value", checked=False)
            if "value" in opts
            else ""
        )
        if not text or pattern is None:
            return _nothing
        fn = _const(text) if isinstance(text, str) else text
        first = pattern

        def run(payload: Any) -> Any:
            value = do.scalar_text(fn(payload))
            if not isinstance(value, str):
                return ""
            value = do.replace(value, first, replacement, ignorecase=ignorecase, every=every)
            if pattern2:
                value = do.replace(
                    value, pattern2, replacement2, ignorecase=ignorecase, every=every
                )
            return value

        return run

    def _build_merge(self, arg: Any, path: Path) -> Fn:
        opts = self.options(arg, path, ("objects", "direction"), ())
        if opts is None:
            return _nothing
        left = self.choice(opts, "direction", path, ("left", "right")) == "left"
        objects = opts.get("objects", [])
        if not isinstance(objects, list):
            return self.problem(
                (*path, "objects"), f"the objects must be an array, not {kind(objects)}"
            )
        fns = [
            self.shape(item, (*path, "objects", i), "each of the objects")
            for i, item in enumerate(objects)
        ]
        if left:
            fns.reverse()

        def run(payload: Any) -> Any:
            out: dict[str, Any] = {}
            for fn in fns:
                do.assign(out, fn(payload))
            return out

        return run

    def _build_transform(self, arg: Any, path: Path) -> Fn:
        opts = self.options(arg, path, ("apply", "mapping"), ())
        if opts is None:
            return _nothing
        first = self.shape(opts.get("apply", {}), (*path, "apply"), "what it applies")
        then = self.shape(opts.get("mapping", {}), (*path, "mapping"), "the mapping")
        where = jsonjs.field_name(path)

        def run(payload: Any) -> Any:
            if payload is UNDEFINED:
                payload = {}
            if not isinstance(payload, dict):
                raise fail(
                    where, f"@transform applies to an object, and this value is {kind(payload)}"
                )
            return then(finish(first(payload)))

        return run

    def _build_flatten(self, arg: Any, path: Path) -> Fn:
        opts = self.options(arg, path, ("separator", "value"), ("omitArrays",))
        if opts is None:
            return _nothing
        separator = self.string(opts, "separator", path)
        if separator == "":
            self.problem((*path, "separator"), "the separator must not be empty")
        fn = self.value(opts.get("value"), (*path, "value"))
        omit = truthy(opts.get("omitArrays"))
        if not separator:
            return _nothing
        sep = separator
        return lambda payload: do.flatten(fn(payload), "", sep, omit)

    def _build_json(self, arg: Any, path: Path) -> Fn:
        opts = self.options(arg, path, ("mode", "value"), ())
        if opts is None:
            return _nothing
        mode = self.choice(opts, "mode", path, ("encode", "decode"))
        if "value" in opts and not truthy(opts["value"]):
            self.problem((*path, "value"), 'the value must not be false, 0, "" or null')
        fn = self.value(opts.get("value"), (*path, "value"))
        if mode == "encode":
            return lambda payload: do.encode(fn(payload))
        return lambda payload: do.decode(fn(payload))

    def _build_excludewhennull(self, arg: Any, path: Path) -> Fn:
        fn = self.value(arg, path)

        def run(payload: Any) -> Any:
            value = fn(payload)
            return UNDEFINED if value is None else do.without_nulls(value)

        return run
