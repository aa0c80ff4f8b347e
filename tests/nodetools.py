"""JavaScript packages the tests run with Node.js, installed from the npm registry with ``npm``
at pinned versions and cached in ``~/.cache/outboxkit``: Ajv 8 and ajv-formats, the JSON Schema
validator a TypeScript consumer of outboxkit's exported schemas uses.

None is a dependency of outboxkit, and nothing is committed (no ``node_modules`` in the
repository). A missing install is made on first use under a lock file, so a test that needs it
while another process installs it (``.ci/run``'s early install, the other pytest-xdist worker)
waits for that install instead of starting a second one. Without Node.js the tests that need it
skip, saying so.

``python3 -m tests.nodetools install`` installs the packages if they are not cached and prints
their directory: ``.ci/run`` runs it with the system's Python (this module needs nothing else).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CACHE = Path.home() / ".cache" / "outboxkit"

#: Seconds an install may take.
INSTALL_TIMEOUT = 600


class NodeInstallError(RuntimeError):
    """The packages are not cached and could not be installed."""


@dataclass(frozen=True)
class NodePackages:
    """npm packages at exact versions, installed together in one directory."""

    name: str
    packages: tuple[str, ...]

    @property
    def directory(self) -> Path:
        return CACHE / f"node-{self.name}"

    @property
    def _done(self) -> Path:
        return self.directory / ".installed"

    def path(self) -> Path:
        """The directory holding ``node_modules``, installed first if it is missing."""
        if self._done.exists():
            return self.directory
        CACHE.mkdir(parents=True, exist_ok=True)
        with (CACHE / f".node-{self.name}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self._done.exists():  # nobody installed it while this waited
                self._install()
        return self.directory

    def _install(self) -> None:
        npm = shutil.which("npm")
        if npm is None:
            raise NodeInstallError(f"{self.name} is not in {self.directory} and there is no npm")
        staging = tempfile.mkdtemp(prefix=f"node-{self.name}-", dir=CACHE)
        try:
            command = [npm, "install", "--no-audit", "--no-fund", "--prefix", staging]
            result = subprocess.run(
                [*command, *self.packages],
                capture_output=True,
                text=True,
                check=False,
                timeout=INSTALL_TIMEOUT,
            )
            if result.returncode != 0:
                raise NodeInstallError(
                    f"npm install {' '.join(self.packages)} failed:\n{result.stdout}{result.stderr}"
                )
            (Path(staging) / ".installed").write_text(" ".join(self.packages) + "\n")
            shutil.rmtree(self.directory, ignore_errors=True)
            # Atomic: whoever looks without the lock sees no directory or a whole one.
            os.replace(staging, self.directory)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


#: Ajv 8 (JSON Schema draft 2020-12, ``ajv/dist/2020``) with its formats.
AJV = NodePackages("ajv-8.20.0", ("ajv@8.20.0", "ajv-formats@3.0.1"))


def main(argv: list[str]) -> int:
    if argv[:1] != ["install"]:
        print("usage: python3 -m tests.nodetools install", file=sys.stderr)
        return 2
    if shutil.which("node") is None:
        print("no node: install Node.js (CI does: .ci/run), or the tests that run Ajv skip")
        return 1
    print(AJV.path())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
