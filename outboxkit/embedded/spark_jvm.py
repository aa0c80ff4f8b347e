"""JVM options for short-lived Spark JVMs: tests, the embedded cluster's daemons.

:func:`quick_jvm_options` is HotSpot's C1 compiler only and the serial GC (a JVM that lives
seconds to minutes spends less on compiling and collecting: a spark-submit run took 48-58 s of
CPU with them against 93-96 s with Spark's defaults, on two cores), plus the class-data-sharing
archive of Spark's classes (:mod:`~outboxkit.embedded.class_archive`): a local session is then
ready on ~2.5 core-s instead of ~4.6, and runs its first query on ~1.9 instead of ~3.3.

Java 17 maps an archive only where the classpath holds no non-empty directory, and Spark puts
``SPARK_CONF_DIR`` first on every JVM's classpath. A JVM given a ``SPARK_CONF_DIR`` that holds
files starts as before, without the archive: give it its settings with ``--properties-file``
(``spark-submit``, ``PYSPARK_SUBMIT_ARGS``, the daemons) instead.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from outboxkit.embedded.class_archive import archive_options, class_archive

__all__ = ["QUICK_JVM", "quick_jvm_options", "spark_class_archive", "spark_environment"]

#: HotSpot's C1 compiler only and the serial GC.
QUICK_JVM = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")

# A local session's start, a JSON round trip and an aggregate: what every Spark JVM here loads.
# The JVM writes the archive as it exits, so the script waits for it to end (stdin closed:
# pyspark's gateway exits on EOF).
_TRAINING = """
import sys
from pyspark import SparkContext
from pyspark.sql import SparkSession, functions as F

spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.extraJavaOptions", sys.argv[1])
    .getOrCreate()
)
rows = spark.range(1000).select((F.col("id") % 7).alias("k"), F.to_json(F.struct("id")).alias("j"))
rows.select("k", F.from_json("j", "id long").alias("p")).groupBy("k").agg(F.sum("p.id")).collect()
gateway = SparkContext._gateway
spark.stop()
gateway.proc.stdin.close()
gateway.proc.wait(120)
"""


def spark_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (this process's environment by default) without ``SPARK_CONF_DIR``."""
    env = dict(os.environ if base is None else base)
    env.pop("SPARK_CONF_DIR", None)
    env.pop("SPARK_ENV_LOADED", None)
    return env


def quick_jvm_options() -> str:
    """:data:`QUICK_JVM` and the class archive's option, as ``extraJavaOptions`` take them."""
    return shlex.join([*QUICK_JVM, *archive_options(spark_class_archive())])


def spark_class_archive() -> Path | None:
    """The class-data-sharing archive of the installed pyspark's classes (made on first use,
    ~22 s), or None if it cannot be made."""
    from outboxkit.embedded.spark_cluster import spark_home  # noqa: PLC0415 (it imports this)

    def train(options: list[str]) -> None:
        subprocess.run(
            [sys.executable, "-c", _TRAINING, shlex.join([*QUICK_JVM, *options])],
            env=spark_environment(),
            capture_output=True,
            check=True,
            timeout=300,
        )

    return class_archive(
        Path.home() / ".cache" / "outboxkit" / "spark-classes",
        "spark",
        java="java",
        classpath=sorted((spark_home() / "jars").glob("*.jar")),
        flags=QUICK_JVM,
        train=train,
    )
