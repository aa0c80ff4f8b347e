"""Every event arrives whole through the Spark pipeline's decoder: over generated models
(tests/event_models.py, limited to the types the pipeline maps), the row each record decodes to
is the registry's event (the Python pass's row, as the parity corpus of test_pipeline_decode.py
compares), decided on the JVM for every model the JVM path supports.

One hypothesis example is a batch of models decoded in one Spark job (a job per model would
cost minutes): ``PARTS`` x ``BATCHES`` x ``MODELS`` = 200 models and records per run, the
reproduction blob printed on failure; ``OUTBOXKIT_WHOLE_BATCHES`` runs more batches."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outboxkit.schemas import Event, EventRegistry, SchemaError, encode
from tests.event_models import build, events, model_specs

pytest.importorskip("pyspark", reason="the Spark pipeline needs the [spark] extra")

from outboxkit.pipeline import decode, jvm_decodable
from outboxkit.pipeline.exceptions import SchemaMappingError
from outboxkit.pipeline.fallback import UNREPRESENTABLE
from outboxkit.pipeline.schema import spark_schema
from tests.integration.test_pipeline_decode import (
    SOURCE_SCHEMA,
    WHEN,
    python_outcomes,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration]

MODELS = int(os.environ.get("OUTBOXKIT_WHOLE_MODELS", "25"))
BATCHES = int(os.environ.get("OUTBOXKIT_WHOLE_BATCHES", "2"))
#: Test items (each within the per-test timeout): PARTS x BATCHES x MODELS = 200 models.
PARTS = 4


@st.composite
def spark_events(draw: st.DrawFn) -> Event:
    """An event of a new model the pipeline can carry, that the writer accepts."""
    spec = draw(model_specs(spark=True))
    model = build(spec)
    try:
        spark_schema(model)
    except SchemaMappingError:
        pytest.skip("unreachable: spec.spark promises a mapping")  # pragma: no cover
    event = draw(events(spec, model))
    try:
        encode(event, source="urn:test")
    except SchemaError:
        return draw(spark_events())  # the writer refuses it: no record to read
    return event


@settings(
    max_examples=BATCHES,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@pytest.mark.parametrize("part", range(PARTS))
@given(st.lists(spark_events(), min_size=MODELS, max_size=MODELS))
def test_the_pipeline_decodes_every_event_whole(spark: Any, part: int, batch: list[Event]) -> None:
    registry = EventRegistry()
    for event in batch:
        registry.register(type(event))
    records = []
    for event in batch:
        wire = encode(event, source="urn:test")
        records.append((wire.key, wire.value, list(wire.headers)))
    rows = [
        (key, value, "t", 0, offset, WHEN, 0, headers)
        for offset, (key, value, headers) in enumerate(records)
    ]
    decoded = decode(spark.createDataFrame(rows, SOURCE_SCHEMA), registry)
    got = decoded.orderBy("offset").toArrow().to_pylist()
    want = python_outcomes(registry, records)
    for event, row, expected in zip(batch, got, want, strict=True):
        label = f"{type(event).__name__} {list(type(event).model_fields)}"
        # Valid for every reader; Spark's column may not hold it (a Decimal without
        # decimal_places in decimal(38, 18): docs/spark.md), then quarantined by both passes.
        assert expected["error_reason"] in {None, UNREPRESENTABLE}, (label, expected)
        assert row["error_reason"] == expected["error_reason"], (label, row["error_message"])
        outcome = {k: v for k, v in row.items() if k in expected and k != "error_message"}
        assert outcome == {k: v for k, v in expected.items() if k != "error_message"}, label
    # The JVM path decides the canonical records of the models it supports (a naive datetime,
    # a year the JVM path leaves out, are the Python pass's): it must decide some of them.
    supported = [row for event, row in zip(batch, got, strict=True) if jvm_decodable(type(event))]
    assert not supported or any(row["decoded_by"] == "jvm" for row in supported)
