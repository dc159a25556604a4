"""Reading the configuration: the TOML file, overridden by EFD_* environment variables,
validated in one pass that names every bad key."""

from __future__ import annotations

import os
import pwd
import stat
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource

from efd.config.checks import cross_checks
from efd.config.models import KeyedProblems, Settings


class ConfigError(Exception):
    """The configuration is invalid; `problems` lists each as "key: what is wrong"."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems

    @property
    def count(self) -> str:
        """How many problems, in words: "1 problem", "3 problems"."""
        n = len(self.problems)
        return f"{n} problem" if n == 1 else f"{n} problems"


def _key(loc: tuple[int | str, ...]) -> str:
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


def _problems(item: Any) -> list[str]:
    """One pydantic error as "key: what is wrong" lines: one, or each of a validator's
    KeyedProblems under its own key (its paths start at the model that holds the value)."""
    loc = tuple(item["loc"])
    error = item.get("ctx", {}).get("error")
    if isinstance(error, KeyedProblems):
        lines = []
        for problem in error.problems:
            path, _, reason = problem.partition(": ")
            head = path.split(".", 1)[0]
            # A field's validator names its paths from the field: "data.email..." of data.
            base = loc[:-1] if loc and loc[-1] == head else loc
            lines.append(f"{_key(base)}.{path}: {reason}" if base else problem)
        return lines
    message = item["msg"].removeprefix("Value error, ")
    if item["type"] == "extra_forbidden":
        message = "unknown key"
    return [f"{_key(loc)}: {message}"]


def _plain(settings: Settings) -> dict[str, Any]:
    data = settings.model_dump()
    for source, model in zip(data["sources"], settings.sources, strict=True):
        source["write_key"] = model.write_key.get_secret_value()
    return data


class ConfigFileError(ConfigError):
    """The file cannot be read or parsed: one problem, "<path>: <why>"."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__([f"{path}: {why}"])
        self.path = path
        self.why = why


def _who() -> str:
    try:
        return f"user {pwd.getpwuid(os.geteuid()).pw_name}"
    except KeyError:  # a uid without a name
        return f"uid {os.geteuid()}"


def _read(path: Path) -> dict[str, Any]:
    """The file's TOML; else ConfigFileError, "<path>: <why>", that shows nothing
    of the content (a config holds write keys and tokens)."""
    try:
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise ConfigFileError(path, "a directory, not a file")
        if not stat.S_ISREG(mode):
            raise ConfigFileError(path, "not a regular file")
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigFileError(path, "no such file") from None
    except PermissionError:
        raise ConfigFileError(path, f"permission denied (efd runs as {_who()})") from None
    except OSError as error:
        raise ConfigFileError(path, f"cannot read it: {error.strerror or 'I/O error'}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        # Where, never what: the exception itself carries the whole file.
        line_start = data.rfind(b"\n", 0, error.start) + 1
        line = data.count(b"\n", 0, error.start) + 1
        column = len(data[line_start : error.start].decode("utf-8")) + 1
        raise ConfigFileError(path, f"not valid UTF-8 (line {line}, column {column})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        # tomllib's messages name a position, and at most a key or one character.
        why = str(error).encode("unicode_escape").decode("ascii")
        raise ConfigFileError(path, f"not valid TOML: {why}") from None


def load(path: str | os.PathLike[str] | None, **overrides: Any) -> Settings:
    """Read and validate the configuration, or raise ConfigError naming every bad key. A
    file that cannot be read or parsed is one problem naming the file and why."""
    raw = _read(Path(path)) if path is not None else {}

    class _FileSettings(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            # The file is read once, above: what is validated is what was read.
            return (init_settings, env_settings, InitSettingsSource(settings_cls, raw))

    try:
        settings: Settings = _FileSettings(**overrides)
    except ValidationError as error:
        problems = [line for item in error.errors() for line in _problems(item)]
        reported = {problem.split(": ", 1)[0] for problem in problems}
        problems += [
            problem for problem in cross_checks(raw) if problem.split(": ", 1)[0] not in reported
        ]
        raise ConfigError(problems) from None
    problems = cross_checks(_plain(settings))
    if problems:
        raise ConfigError(problems)
    return settings
