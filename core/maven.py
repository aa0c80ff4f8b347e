"""Copying a Maven artifact's runtime dependencies into a directory, with the ``mvn`` command.

The Kafka broker's jars (``outboxkit.embedded.kafka_jars``) and the Spark connector's
(``outboxkit.pipeline.jars``) are fetched this way: nothing is built, Maven resolves the
dependencies from Maven Central and copies them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

_POM = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by outboxkit: used only to copy dependencies' jars. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.outboxkit</groupId>
  <artifactId>{name}</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""

_DEPENDENCY = """    <dependency>
      <groupId>{}</groupId>
      <artifactId>{}</artifactId>
      <version>{}</version>
    </dependency>"""


def copy_dependencies(
    coordinates: Sequence[tuple[str, str, str]],
    output: Path,
    *,
    work: Path,
    name: str,
    repository_layout: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Copy the runtime dependencies of ``coordinates`` (group, artifact, version) into
    ``output`` (as a repository layout, ``<group path>/<artifact>/<version>/``, if asked);
    the POM goes to ``work``. The caller reads ``returncode`` and the output."""
    pom = work / f"pom-{name}.xml"
    dependencies = "\n".join(_DEPENDENCY.format(*c) for c in coordinates)
    pom.write_text(_POM.format(name=name, dependencies=dependencies))
    command = [
        "mvn",
        "-q",
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={output}",
    ]
    if repository_layout:
        command.append("-Dmdep.useRepositoryLayout=true")
    return subprocess.run(command, capture_output=True, text=True, check=False)
