"""A long fuzzing run of the inbox's input paths, for releases: the property-based suite of
``tests/unit/test_inbox_fuzz.py`` (decoder, dead letters, lenient batch reader) with many more
examples than CI runs.

    python bench/fuzz_inbox.py [--examples 20000] [--seed N]

Prints hypothesis's statistics per property; exits non-zero on a failure, with the minimal
failing example (add it to the suite as an ``@example``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=20_000, help="examples per property")
    parser.add_argument("--seed", type=int, help="hypothesis seed (default: random)")
    args = parser.parse_args()
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--hypothesis-show-statistics",
        "tests/unit/test_inbox_fuzz.py",
    ]
    if args.seed is not None:
        command.append(f"--hypothesis-seed={args.seed}")
    env = {**os.environ, "OUTBOXKIT_FUZZ_EXAMPLES": str(args.examples)}
    sys.exit(subprocess.run(command, cwd=REPO, env=env, check=False).returncode)
