"""``no_nulls`` (outboxkit/pipeline/arrays.py): the decoder accepts an array of required entries
only when it holds no null. Looked up with ``array_contains`` and a probe value for strings,
integers and floats (a sort for other types): a null anywhere is found, and an array that holds
the probe itself is reported as holding one (its record goes to the Python pass), never the
other way round."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the Spark pipeline needs the [spark] extra")

from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, DataType, DoubleType, LongType, StringType

from outboxkit.pipeline.arrays import _PROBES, no_nulls

pytestmark = [pytest.mark.integration, pytest.mark.spark]

CASES: list[tuple[DataType, list[Any]]] = [
    (StringType(), ["a", "", "b"]),
    (LongType(), [0, -1, 2**63 - 1]),
    (DoubleType(), [0.5, -0.0, 1e308]),
    (BooleanType(), [True, False]),
]


@pytest.mark.parametrize(("element", "values"), CASES, ids=lambda c: str(c)[:12])
def test_a_null_entry_is_found_wherever_it_is(
    spark: Any, element: DataType, values: list[Any]
) -> None:
    arrays: list[list[Any]] = [
        [],
        values,
        [None],
        [None, *values],
        [*values[:1], None, *values[1:]],
        [*values, None],
    ]
    probe = _PROBES.get(type(element))
    if probe is not None:
        arrays += [[probe], [*values, probe], [*values, probe, None]]
    frame = spark.createDataFrame([(a,) for a in arrays], f"a {ArrayType(element).simpleString()}")
    got = [row[0] for row in frame.select(no_nulls(F.col("a"), element)).collect()]
    # The probe counts as a null: rejected here, decided by the Python pass instead.
    want = [None not in a and (probe is None or probe not in a) for a in arrays]
    assert got == want
    untyped = [row[0] for row in frame.select(no_nulls(F.col("a"))).collect()]
    assert untyped == [None not in a for a in arrays]
