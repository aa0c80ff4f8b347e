"""Checks over every entry of an array column, without a lambda function.

Spark interprets its lambda functions (``forall``, ``transform``…) instead of generating code
for them, and a projection that holds one is not compiled as a whole (the demo's ``forall``
over each order's ``lines`` kept four of the decoder's projections interpreted; without them
decoding takes a fifth less CPU, docs/spark.md "Figures"). These functions say the same
with expressions Spark compiles: the smallest or largest entry (``array_min`` /
``array_max``), a set difference, a sort, and one regular expression over the entries joined.
Each is true when *every non-null entry* passes (nulls are checked apart, with
:func:`no_nulls`); an empty array passes.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column
from pyspark.sql import functions as F

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


def no_nulls(a: Column) -> Column:
    """No entry of the (non-null) array is null: sorted, nulls come first."""
    return (F.size(a) == 0) | F.get(F.sort_array(a), 0).isNotNull()
