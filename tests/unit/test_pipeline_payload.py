"""The decimal rule of the JVM path (outboxkit.pipeline.payload): one regular expression says
what the earlier three (format, whole digits, fraction digits once trailing zeros are dropped)
said, so a Decimal array's entries can be checked joined, without a lambda."""

from __future__ import annotations

import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

pytest.importorskip("pyspark", reason="the Spark pipeline needs the [spark] extra")

from outboxkit.pipeline.payload import _DECIMAL, _decimal_pattern


def _by_the_three_rules(text: str, whole: int, fraction: int) -> bool:
    """The rules as the JVM path first wrote them (``regexp_extract`` on the string)."""
    if not re.search(_DECIMAL.replace(r"\z", r"\Z"), text):  # Java's \z is Python's \Z
        return False
    head = re.search(r"^-?0*([0-9]*)", text)
    tail = re.search(r"\.([0-9]*?)0*$", text)
    digits = len(head.group(1)) if head else 0
    places = len(tail.group(1)) if tail else 0
    return digits <= whole and places <= fraction


@given(
    text=st.from_regex(r"\A-?[0-9]{0,6}(\.[0-9]{0,6})?\Z")
    | st.text("-0123456789.,e \n", max_size=9),
    whole=st.integers(0, 4),
    fraction=st.integers(0, 4),
)
@example(text="0.500", whole=0, fraction=1)
@example(text="-0", whole=0, fraction=0)
@example(text="10.", whole=2, fraction=2)
@example(text="4,50", whole=2, fraction=2)
@example(text="4.50\n", whole=2, fraction=2)
def test_the_decimal_pattern_says_what_the_three_rules_said(
    text: str, whole: int, fraction: int
) -> None:
    pattern = re.compile(rf"^{_decimal_pattern(whole, fraction)}\Z")
    assert bool(pattern.search(text)) == _by_the_three_rules(text, whole, fraction)
