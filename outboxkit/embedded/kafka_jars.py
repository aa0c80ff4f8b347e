"""The jars of a real Apache Kafka broker, fetched once from Maven Central with Maven.

``outboxkit dev jars`` (or :func:`fetch_kafka_jars`) puts them in
``~/.cache/outboxkit/kafka-<version>`` (``OUTBOXKIT_KAFKA_JARS`` overrides the directory);
``outboxkit dev up``, ``outboxkit demo --broker kafka`` and the test fixtures run the broker
from there with Java 17. Nothing is built: Maven only copies the broker's runtime dependencies.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.maven import copy_dependencies

DEFAULT_KAFKA_VERSION = "4.4.0"
_MARKER = ".complete"

#: The broker, and an SLF4J 1.7 binding to log4j2 for its logs (whose output the fixtures read).
_ARTIFACTS = (
    ("org.apache.kafka", "kafka_2.13", "{version}"),
    ("org.apache.logging.log4j", "log4j-slf4j-impl", "2.24.3"),
)

#: What to run when the jars are missing: a command every installation has.
FETCH_HINT = "run `outboxkit dev jars` (needs Maven and Java 17)"


def default_jars_dir(version: str = DEFAULT_KAFKA_VERSION) -> Path:
    configured = os.environ.get("OUTBOXKIT_KAFKA_JARS")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "outboxkit" / f"kafka-{version}"


def _complete(path: Path, version: str) -> bool:
    return (path / _MARKER).exists() or (path / f"kafka_2.13-{version}.jar").exists()


def kafka_jars_dir(version: str = DEFAULT_KAFKA_VERSION) -> Path:
    """Where the fetched jars are; :class:`ConfigurationError` says how to fetch them."""
    path = default_jars_dir(version)
    if not _complete(path, version) and not any(path.glob("kafka_2.13-*.jar")):
        raise ConfigurationError(
            f"no Apache Kafka jars in {path}: {FETCH_HINT}, or set OUTBOXKIT_KAFKA_JARS to a "
            "directory holding them"
        )
    return path


def fetch_kafka_jars(version: str = DEFAULT_KAFKA_VERSION) -> Path:
    """Fetch the broker's jars once (later calls return at once); return their directory."""
    dest = default_jars_dir(version)
    if _complete(dest, version):
        return dest
    if shutil.which("mvn") is None:
        raise ConfigurationError(
            "Maven is missing (apt-get install maven): it fetches Apache Kafka's jars; or set "
            "OUTBOXKIT_KAFKA_JARS to a directory holding them"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="outboxkit-kafka-jars-", dir=dest.parent) as work:
        jars = Path(work) / "jars"
        artifacts = [(g, a, v.format(version=version)) for g, a, v in _ARTIFACTS]
        result = copy_dependencies(artifacts, jars, work=Path(work), name="embedded-kafka")
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip()
            raise ConfigurationError(
                f"Maven could not fetch Apache Kafka {version}:\n{output[-2000:]}"
            )
        (jars / _MARKER).write_text(version)
        # Another process may have finished first: theirs is as good as ours.
        if not _complete(dest, version):
            shutil.rmtree(dest, ignore_errors=True)
            jars.rename(dest)
    return dest
