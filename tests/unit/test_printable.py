"""printable(): nothing a terminal could act on gets through, and printable text is unchanged."""

from __future__ import annotations

import ast

from hypothesis import given
from hypothesis import strategies as st

from outboxkit.core.printable import printable


@given(st.text())
def test_the_result_is_printable_and_reads_back_as_the_text(text: str) -> None:
    shown = printable(text)
    assert shown.isprintable()
    # Escapes are Python's own: a text without backslashes reads back exactly.
    if "\\" not in text and "'" not in text:
        assert ast.literal_eval(f"'{shown}'") == text


@given(st.text(st.characters(categories=["L", "M", "N", "P", "S"]).filter(str.isprintable)))
def test_printable_text_is_unchanged(text: str) -> None:
    assert printable(text) == text


def test_what_a_terminal_acts_on_is_escaped() -> None:
    assert printable("a\x1b]0;pwned\x07b") == r"a\x1b]0;pwned\x07b"
    assert printable("line\r\nforged\ttab\x08\x7f") == r"line\r\nforged\ttab\x08\x7f"
    assert printable("\x9b31m\x85") == r"\x9b31m\x85"  # C1: CSI, NEL
    assert printable("\u202eevil\u200b\u2028") == r"\u202eevil\u200b\u2028"
    assert printable("café 東京 a b") == "café 東京 a b"
    assert printable(None) == "None"
