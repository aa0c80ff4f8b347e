"""The jars of a real Apache Kafka broker, fetched once from Maven Central with Maven.

``outboxkit dev jars`` (or :func:`fetch_kafka_jars`) puts them in
``~/.cache/outboxkit/kafka-<version>`` (``OUTBOXKIT_KAFKA_JARS`` overrides the directory);
``outboxkit dev up``, ``outboxkit demo --broker kafka`` and the test fixtures run the broker
from there with Java 17. Nothing is built: Maven only copies the broker's runtime dependencies.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from outboxkit.core.exceptions import ConfigurationError

DEFAULT_KAFKA_VERSION = "4.4.0"
_MARKER = ".complete"

_POM = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by outboxkit.embedded.kafka_jars: used only to copy the broker's jars. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.outboxkit</groupId>
  <artifactId>outboxkit-embedded-kafka</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{version}</version>
    </dependency>
    <!-- The broker logs through SLF4J 1.7: bind it to log4j2, whose output the fixtures read. -->
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>2.24.3</version>
    </dependency>
  </dependencies>
</project>
"""

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
        pom = Path(work) / "pom.xml"
        pom.write_text(_POM.format(version=version))
        jars = Path(work) / "jars"
        command = [
            "mvn",
            "-q",
            "-B",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={jars}",
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
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
