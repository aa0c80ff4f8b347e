"""The session the pipeline builds from its settings: local tuning for local masters only."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from outboxkit.pipeline import PipelineSettings

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pyspark") is None, reason="needs the [spark] extra"
)


def conf(master: str, **extra: Any) -> dict[str, str]:
    from outboxkit.pipeline.session import session_conf  # noqa: PLC0415 (imports pyspark)

    settings = PipelineSettings(pipeline_output="/lake", spark_master=master, **extra)
    return session_conf(settings, ["/jars/a.jar", "/jars/b.jar"])


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[4,3]"])
def test_a_local_master_gets_few_shuffle_partitions(master: str) -> None:
    got = conf(master)
    assert got["spark.master"] == master
    assert got["spark.jars"] == "/jars/a.jar,/jars/b.jar"
    assert got["spark.sql.shuffle.partitions"] == "4"
    assert got["spark.databricks.delta.snapshotPartitions"] == "4"
    assert got["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"


@pytest.mark.parametrize(
    "master", ["spark://10.0.0.1:7077", "yarn", "k8s://https://k8s:443", "local-cluster[2,1,1024]"]
)
def test_a_cluster_master_keeps_sparks_defaults(master: str) -> None:
    """4 shuffle partitions would cap a cluster's state store at 4 tasks for the checkpoint's
    whole life; the jars and Delta are still the session's, for the executors to fetch."""
    got = conf(master)
    assert "spark.sql.shuffle.partitions" not in got
    assert "spark.databricks.delta.snapshotPartitions" not in got
    assert got["spark.jars"] == "/jars/a.jar,/jars/b.jar"
    assert got["spark.sql.catalog.spark_catalog"].endswith("DeltaCatalog")
    given = conf(master, spark_shuffle_partitions=12)
    assert given["spark.sql.shuffle.partitions"] == "12"
    assert given["spark.databricks.delta.snapshotPartitions"] == "12"


def test_local_paths_are_named_on_a_cluster_only() -> None:
    """A path without a scheme is each machine's own: on a cluster the executors' Delta files
    and state would be scattered over the nodes unless all mount the same directory."""
    from outboxkit.pipeline.session import node_local_paths  # noqa: PLC0415

    def settings(output: str, checkpoint: str | None = None) -> PipelineSettings:
        return PipelineSettings(pipeline_output=output, pipeline_checkpoint=checkpoint)

    assert node_local_paths("local[2]", settings("/lake")) == []
    assert node_local_paths("spark://m:7077", settings("/lake")) == ["/lake", "/lake/_checkpoints"]
    assert node_local_paths("yarn", settings("file:///lake", "hdfs://nn/cp")) == ["file:///lake"]
    assert node_local_paths("yarn", settings("s3a://b/lake", "abfss://c@a/cp")) == []
    assert node_local_paths("k8s://https://k:443", settings("lake")) == [
        "lake",
        "lake/_checkpoints",
    ]
