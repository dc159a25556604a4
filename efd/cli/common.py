"""What every `efd` command shares: loading the configuration, refused in one place."""

from __future__ import annotations

import sys

from efd import config


def load_settings(path: str) -> config.Settings:
    try:
        return config.load(path)
    except config.ConfigFileError as error:
        print(f"efd: {error}", file=sys.stderr)  # one line: the file and why, none of it
        raise SystemExit(2) from None
    except config.ConfigError as error:
        print(f"efd: invalid configuration ({error.count}):", file=sys.stderr)
        for problem in error.problems:
            print(f"  {problem}", file=sys.stderr)
        raise SystemExit(2) from None
