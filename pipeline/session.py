"""The SparkSession: built from the settings (a local master, or a cluster's: ``spark://…``,
``yarn``, ``k8s://…``), or spark-submit's own."""

from __future__ import annotations

import os
import re
import sys

from pyspark.sql import SparkSession

from outboxkit.pipeline.jars import pipeline_jars
from outboxkit.pipeline.settings import PipelineSettings

#: Local runs use few shuffle (= state store) partitions: 200 would mean 200 tiny state stores.
LOCAL_SHUFFLE_PARTITIONS = 4

#: Delta Lake's SQL extension and catalog (MERGE, and the Delta sink's idempotent writes).
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


#: SQL settings the pipeline sets on its session unless the session was given its own values
#: (``spark-submit --conf``, or the builder's ``config``); measured in bench/results/spark.md,
#: "Figures".
PIPELINE_SQL_CONF = {
    # The decoder's Python pass is an Arrow UDF that Spark feeds every row of a micro-batch
    # (nulls for the rows decided on the JVM). Below this value Spark checks the Arrow batch's
    # size after every row, which walks the list column (the headers, null on that path) back
    # to its last non-null value each time: quadratic in the rows per Arrow batch, the JVM's
    # largest single cost on the demo stream. At Int.MaxValue the check is off (+13% events/s,
    # -15% CPU per event, bench/results/spark.md "Figures"); Arrow batches stay bounded by
    # spark.sql.execution.arrow.maxRecordsPerBatch (10,000 rows).
    "spark.sql.execution.arrow.maxBytesPerBatch": "2147483647",
    # HotSpot never compiles a method over 8000 bytes of bytecode (DontCompileHugeMethods), and
    # the decoder's projections, compiled as a whole stage, make processNext larger than that:
    # it ran interpreted, a third of the decoding's CPU. At 8000 Spark compiles such a stage
    # operator by operator instead (Spark's own advice for HotSpot; bench/results/spark.md,
    # "Figures").
    "spark.sql.codegen.hugeMethodLimit": "8000",
}


def local_delta_conf(partitions: int) -> dict[str, str]:
    """Delta settings for a local session, or a cluster's given shuffle partitions: its
    transaction log is read with as many tasks as the shuffle (Delta's default, 50, costs
    seconds per commit on two cores)."""
    return {"spark.databricks.delta.snapshotPartitions": str(partitions)}


def under_spark_submit() -> bool:
    """Whether this Python process was started by ``spark-submit`` (its JVM is already up)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def is_local(master: str) -> bool:
    """Whether ``master`` runs everything in the driver's JVM: ``local``, ``local[n]``,
    ``local[*]``, ``local[n,retries]`` (``local-cluster[…]`` starts executor JVMs, as a cluster
    does)."""
    return master == "local" or master.startswith("local[")


def session_conf(settings: PipelineSettings, jars: list[str]) -> dict[str, str]:
    """What a session built from the settings gets: the master, the jars (a cluster's executors
    fetch them from the driver), Delta; and, for a local master, few shuffle partitions and
    as few Delta snapshot tasks. On a cluster they would cap the state store's parallelism for
    good (the first run fixes it in the checkpoint): Spark's and Delta's defaults apply there,
    unless ``OUTBOXKIT_SPARK_SHUFFLE_PARTITIONS`` sets both."""
    conf = {
        "spark.master": settings.spark_master,
        "spark.jars": ",".join(jars),
        "spark.ui.showConsoleProgress": "false",
        **DELTA_CONF,
    }
    if is_local(settings.spark_master):
        partitions = settings.spark_shuffle_partitions or LOCAL_SHUFFLE_PARTITIONS
        conf["spark.sql.shuffle.partitions"] = str(partitions)
        conf.update(local_delta_conf(partitions))
    elif settings.spark_shuffle_partitions:
        conf["spark.sql.shuffle.partitions"] = str(settings.spark_shuffle_partitions)
        conf.update(local_delta_conf(settings.spark_shuffle_partitions))
    return conf


def node_local_paths(master: str, settings: PipelineSettings) -> list[str]:
    """The output and checkpoint roots that, under a cluster ``master``, are paths of each
    machine's own file system (no scheme, or ``file:``). Executors write the Delta tables and
    the state store there on *their* machines, the driver the offsets on its own: correct only
    if every machine mounts the same shared directory there."""
    if is_local(master):
        return []
    roots = dict.fromkeys([settings.pipeline_output, settings.checkpoint])
    return [r for r in roots if r.startswith("file:") or not re.match(r"^[A-Za-z][\w+.-]*:", r)]


def build_session(settings: PipelineSettings) -> SparkSession:
    """The session: master and jars from the settings unless under ``spark-submit``, which
    brings its own master, ``--packages`` and ``--conf`` (see docs/spark.md)."""
    builder = SparkSession.builder.appName(f"outboxkit-{settings.pipeline_name}")
    partitions = settings.spark_shuffle_partitions
    if not under_spark_submit():
        jars = pipeline_jars(
            settings.spark_jars, connector_version=settings.spark_connector_version
        )
        conf = session_conf(settings, [str(jar) for jar in jars])
        for key, value in conf.items():
            builder = builder.config(key, value)
        shuffle = conf.get("spark.sql.shuffle.partitions")
        partitions = int(shuffle) if shuffle else None
        use_this_python_for_workers()
    spark = builder.getOrCreate()
    configure_session(spark, shuffle_partitions=partitions)
    return spark


def use_this_python_for_workers() -> None:
    """Python workers run this interpreter unless ``PYSPARK_PYTHON`` says otherwise — on a
    cluster too: the driver sends the path to the executors, which need it on every node.
    PySpark reads only that variable (``spark.pyspark.python`` is spark-submit's), and its
    default, ``python3`` from ``PATH``, lacks outboxkit outside an activated virtualenv: the
    decoder's Python pass would fail on the first batch."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def configure_session(spark: SparkSession, *, shuffle_partitions: int | None = None) -> None:
    """Runtime settings the pipeline relies on: event times and windows in UTC, and
    :data:`PIPELINE_SQL_CONF` where the session has no value of its own."""
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    given = spark.sparkContext.getConf()
    for key, value in PIPELINE_SQL_CONF.items():
        if not given.contains(key):
            spark.conf.set(key, value)
    if shuffle_partitions is not None:
        spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
