"""``python -m outboxkit.embedded.mongodb fetch``: put mongod in the cache, print its path."""

from __future__ import annotations

import argparse
import sys

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.embedded.mongodb._binary import MONGOD_VERSION, find_mongod, mongod_cache_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m outboxkit.embedded.mongodb",
        description=f"The MongoDB {MONGOD_VERSION} server (SSPL) that tests and the demo run.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "fetch",
        help=f"download mongod into {mongod_cache_dir()} (once) and print its path; "
        "prints $OUTBOXKIT_MONGOD instead if that is set",
    )
    parser.parse_args(argv)
    try:
        print(find_mongod(fetch=True))
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
