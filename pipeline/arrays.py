"""Checks over every entry of an array column, without a lambda function.

Spark interprets its lambda functions (``forall``, ``transform``…) instead of generating code
for them, and a projection that holds one is not compiled as a whole (the demo's ``forall``
over each order's ``lines`` kept four of the decoder's projections interpreted; without them
decoding takes a fifth less CPU, bench/results/spark.md "Figures"). These functions say the same
with expressions Spark compiles: the smallest or largest entry (``array_min`` /
``array_max``), a set difference, a sort, and one regular expression over the entries joined.
Each is true when *every non-null entry* passes (nulls are checked apart, with
:func:`no_nulls`); an empty array passes.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DoubleType, LongType, StringType

Rule = Callable[[Column], Column]

_OPERATORS: dict[str, Callable[[Column, Column], Column]] = {
    "gt": lambda c, v: c > v,
    "ge": lambda c, v: c >= v,
    "lt": lambda c, v: c < v,
    "le": lambda c, v: c <= v,
}


def all_compare(op: str, bound: object) -> Rule:
    """Every entry ``op`` (``gt ge lt le``) ``bound``: tested on the smallest or the largest."""

    def rule(a: Column) -> Column:
        edge = F.array_min(a) if op in {"gt", "ge"} else F.array_max(a)
        return F.coalesce(_OPERATORS[op](edge, F.lit(bound)), F.lit(True))

    return rule


def all_finite(a: Column) -> Column:
    """Every entry of a ``double`` array is finite (NaN sorts above every number in Spark, so
    the largest entry is NaN when any is)."""
    largest, smallest = F.array_max(a), F.array_min(a)
    return F.coalesce(
        ~F.isnan(largest) & (largest != F.lit(float("inf"))) & (smallest != F.lit(float("-inf"))),
        F.lit(True),
    )


def all_members(members: Column) -> Rule:
    """Every entry is one of ``members`` (an array literal of the entries' type)."""

    def rule(a: Column) -> Column:
        return F.size(F.array_except(a, F.concat(members, F.array(F.lit(None))))) == 0

    return rule


def all_match(pattern: str) -> Rule:
    """Every entry of a string array matches ``pattern``, which must match neither ``""`` nor
    anything holding a comma: one regular expression over the entries joined with commas
    (nulls as empty entries); as many commas as entries less one proves that no entry holds
    one, and no entry may be ``""`` (it would pass for a null)."""

    def rule(a: Column) -> Column:
        joined = F.array_join(a, ",", "")
        commas = F.length(joined) - F.length(F.replace(joined, F.lit(","), F.lit("")))
        return (F.size(a) == 0) | (
            joined.rlike(rf"^({pattern})?(,({pattern})?)*\z")
            & (commas == F.size(a) - 1)
            & ~F.coalesce(F.array_contains(a, F.lit("")), F.lit(False))
        )

    return rule


#: Per entry type, a value looked for to tell whether an array holds a null (see no_nulls):
#: one an event is unlikely to hold, since an array that holds it is not accepted here.
_PROBES: dict[type[DataType], object] = {
    StringType: "\x00outboxkit: no entry holds this\x00",
    LongType: -(2**63),
    DoubleType: -1.7976931348623157e308,
}


def no_nulls(a: Column, element: DataType | None = None) -> Column:
    """No entry of the (non-null) array is null.

    ``array_contains`` is null exactly when it finds no match but meets a null, so looking for
    a value no entry holds says it in one compiled scan; an array that does hold that value is
    reported as holding a null, which only leaves its record to the Python pass (never accepts
    a wrong one). For other entry types (or none given): sorted, nulls come first — an
    interpreted sort that copies the array, several times the cost of the scan."""
    probe = _PROBES.get(type(element)) if element is not None else None
    if probe is not None:
        return F.coalesce(~F.array_contains(a, F.lit(probe)), F.lit(False))
    return (F.size(a) == 0) | F.get(F.sort_array(a), 0).isNotNull()
