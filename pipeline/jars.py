"""The pipeline's jars for local runs, fetched with Maven: the Spark Kafka connector
(``spark-sql-kafka-0-10``) and Delta Lake (``delta-spark``).

pyspark ships no Kafka connector. On a cluster, ``spark-submit --packages
org.apache.spark:spark-sql-kafka-0-10_2.13:<spark version>`` resolves it. ``outboxkit pipeline
run`` and the tests instead fetch the connector and its dependencies once, with Maven (like the
Kafka broker's jars), into ``~/.cache/outboxkit/spark-kafka-<pyspark version>``, and pass them
as ``spark.jars``. Jars that pyspark already ships (Scala, Hadoop client, Spark's own…) are left
out so that one copy of each class is on the classpath.

The connector must match Spark's version. When Maven Central has no connector of exactly the
installed pyspark version, the newest release of the same major version before it is taken, and
a warning says so (the pipeline's tests run against that combination). ``python -m
outboxkit.pipeline.jars`` fetches both and prints their directories.

Delta Lake's jars are ``io.delta:delta-spark_<Spark major.minor>_2.13:<delta-spark version>``,
the version of the installed ``delta-spark`` Python package (its jars and its Python code go
together), cached in ``~/.cache/outboxkit/delta-<version>-spark-<major.minor>``.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path

from outboxkit.core.maven import copy_dependencies
from outboxkit.pipeline.exceptions import ConnectorUnavailableError

log = logging.getLogger(__name__)

SCALA_BINARY_VERSION = "2.13"
CONNECTOR_GROUP = "org.apache.spark"
CONNECTOR_ARTIFACT = f"spark-sql-kafka-0-10_{SCALA_BINARY_VERSION}"
_MARKER = ".complete"
MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2"


def spark_version() -> str:
    """The installed pyspark's version (without importing pyspark)."""
    try:
        return importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        raise ConnectorUnavailableError(
            "pyspark is not installed: pip install 'outboxkit[spark]'"
        ) from None


def connector_coordinates(version: str) -> str:
    """``group:artifact:version`` of the connector, as ``spark-submit --packages`` takes it."""
    return f"{CONNECTOR_GROUP}:{CONNECTOR_ARTIFACT}:{version}"


def default_jars_dir(spark: str | None = None) -> Path:
    """Where the connector for ``spark`` (default: the installed pyspark) is cached."""
    override = os.environ.get("OUTBOXKIT_SPARK_JARS")
    if override:
        return Path(override)
    return Path.home() / ".cache" / "outboxkit" / f"spark-kafka-{spark or spark_version()}"


def connector_version_in(jars_dir: Path) -> str | None:
    """The connector version a complete jar directory holds, or ``None``."""
    marker = jars_dir / _MARKER
    if not marker.is_file():
        return None
    return marker.read_text().strip() or None


def connector_jars(jars_dir: Path) -> list[Path]:
    """The jars of a complete directory (for ``spark.jars``)."""
    if connector_version_in(jars_dir) is None:
        raise ConnectorUnavailableError(
            f"{jars_dir} holds no fetched connector: run `outboxkit pipeline jars`"
        )
    return sorted(jars_dir.glob("*.jar"))


def fetch_connector(dest: Path | None = None, *, version: str | None = None) -> Path:
    """Fetch the connector and its dependencies into ``dest`` once; return the directory.

    ``version`` pins the connector; by default the installed pyspark's version, or the newest
    release of its major version before it if Maven Central has none of that exact version.
    """
    installed = spark_version()
    dest = dest or default_jars_dir(installed)
    if connector_version_in(dest):
        return dest
    if shutil.which("mvn") is None:
        raise ConnectorUnavailableError(
            "Maven is missing (apt-get install maven): it fetches the Spark Kafka connector; "
            "or pass OUTBOXKIT_SPARK_JARS=<dir with the jars>"
        )
    wanted = version or installed
    with tempfile.TemporaryDirectory(prefix="outboxkit-spark-") as work:
        try:
            layout = _maven_copy(Path(work), wanted)
        except _NotPublishedError:
            if version is not None:
                raise ConnectorUnavailableError(
                    f"Maven Central has no {connector_coordinates(version)}"
                ) from None
            wanted = _newest_published_before(installed)
            layout = _maven_copy(Path(work), wanted)
        resolved = _install(layout, dest)
    if resolved != installed:
        log.warning(
            "Maven Central has no %s; using connector %s with pyspark %s",
            connector_coordinates(installed),
            resolved,
            installed,
        )
    return dest


class _NotPublishedError(Exception):
    pass


def _maven_copy(
    work: Path, version: str, group: str = CONNECTOR_GROUP, artifact: str = CONNECTOR_ARTIFACT
) -> Path:
    """An artifact's runtime dependencies, in a Maven repository layout under ``work``."""
    layout = work / f"jars-{version}"
    result = copy_dependencies(
        [(group, artifact, version)],
        layout,
        work=work,
        name=f"{artifact}-{version}",
        repository_layout=True,
    )
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        connector = f"{group}:{artifact}:jar:{version}"
        if (
            f"Could not find artifact {connector}" in output
            or f"{connector} was not found" in output
        ):
            raise _NotPublishedError(version)
        raise ConnectorUnavailableError(
            f"Maven could not fetch {group}:{artifact}:{version}:\n{output[-2000:]}"
        )
    return layout


def _newest_published_before(installed: str) -> str:
    """The newest release of ``installed``'s major version up to it, from Maven Central."""
    group = CONNECTOR_GROUP.replace(".", "/")
    url = f"{MAVEN_CENTRAL}/{group}/{CONNECTOR_ARTIFACT}/maven-metadata.xml"
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            metadata = response.read().decode()
    except OSError as exc:
        raise ConnectorUnavailableError(
            f"Maven Central has no {connector_coordinates(installed)} and listing its versions "
            f"failed ({exc}); pin one with OUTBOXKIT_SPARK_CONNECTOR_VERSION"
        ) from None
    target = _release(installed)
    candidates = [
        parsed
        for text in re.findall(r"<version>([^<]+)</version>", metadata)
        if (parsed := _release(text)) is not None
        and target is not None
        and parsed[0] == target[0]
        and parsed <= target
    ]
    if not candidates:
        raise ConnectorUnavailableError(
            f"Maven Central has no {CONNECTOR_ARTIFACT} release for Spark {installed}"
        )
    return ".".join(map(str, max(candidates)))


def _release(version: str) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` of a release version; ``None`` for previews and the like."""
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def _install(layout: Path, dest: Path, artifact_name: str = CONNECTOR_ARTIFACT) -> str:
    """Copy the jars pyspark does not ship from a repository layout into ``dest``."""
    shipped = _pyspark_jar_names()
    tmp = dest.with_name(f"{dest.name}.tmp.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    resolved = ""
    for jar in layout.rglob("*.jar"):
        artifact = jar.parent.parent.name  # <group path>/<artifact>/<version>/<file>.jar
        if artifact == artifact_name:
            resolved = jar.parent.name
        if any(re.match(rf"{re.escape(artifact)}-\d", name) for name in shipped):
            continue
        shutil.copy2(jar, tmp / jar.name)
    if not resolved:
        raise ConnectorUnavailableError(f"Maven did not deliver {artifact_name}")
    (tmp / _MARKER).write_text(resolved + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(dest)
    return resolved


def _pyspark_jar_names() -> list[str]:
    try:
        files = importlib.metadata.files("pyspark") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    return [f.name for f in files if f.parent.name == "jars" and f.name.endswith(".jar")]


DELTA_GROUP = "io.delta"


def delta_version() -> str:
    """The installed ``delta-spark`` package's version."""
    try:
        return importlib.metadata.version("delta-spark")
    except importlib.metadata.PackageNotFoundError:
        raise ConnectorUnavailableError(
            "delta-spark is not installed: pip install 'outboxkit[spark]'"
        ) from None


def delta_artifact(spark: str | None = None) -> str:
    """``delta-spark_<major.minor>_2.13`` for ``spark`` (default: the installed pyspark)."""
    major_minor = ".".join((spark or spark_version()).split(".")[:2])
    return f"delta-spark_{major_minor}_{SCALA_BINARY_VERSION}"


def fetch_delta(dest: Path | None = None) -> Path:
    """Fetch Delta Lake's jars (for the installed pyspark and delta-spark) once."""
    version, artifact = delta_version(), delta_artifact()
    dest = dest or Path.home() / ".cache" / "outboxkit" / f"delta-{version}-{artifact}"
    if connector_version_in(dest):
        return dest
    if shutil.which("mvn") is None:
        raise ConnectorUnavailableError(
            "Maven is missing (apt-get install maven): it fetches Delta"
        )
    with tempfile.TemporaryDirectory(prefix="outboxkit-delta-") as work:
        try:
            layout = _maven_copy(Path(work), version, DELTA_GROUP, artifact)
        except _NotPublishedError:
            raise ConnectorUnavailableError(
                f"Maven Central has no {DELTA_GROUP}:{artifact}:{version}; install a delta-spark "
                "whose jars exist for this Spark (docs/versions.md)"
            ) from None
        _install(layout, dest, artifact)
    return dest


def pipeline_jars(
    jars_dir: str | None = None, *, connector_version: str | None = None
) -> list[Path]:
    """Every jar a local run needs: ``jars_dir`` as given (all of them, filled by you), or
    the fetched connector and Delta Lake, each artifact once."""
    if jars_dir:
        return sorted(Path(jars_dir).glob("*.jar"))
    jars: dict[str, Path] = {}
    for directory in (fetch_connector(version=connector_version), fetch_delta()):
        for jar in connector_jars(directory):
            jars.setdefault(re.sub(r"-\d[^/]*\.jar$", "", jar.name), jar)
    return sorted(jars.values())


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        print(fetch_connector(version=os.environ.get("OUTBOXKIT_SPARK_CONNECTOR_VERSION")))
        print(fetch_delta())
    except ConnectorUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
