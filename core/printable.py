"""Record data made safe to print on a terminal.

Headers, keys, error messages, topic names and client ids come from whoever wrote a record or
joined a group. Printed raw, an escape sequence in them acts on the operator's terminal (sets
its title, rewrites what was printed before, hides text, forges lines). Every command that
prints such data passes it through :func:`printable` first; ``--json`` output needs nothing
more (JSON escapes control characters itself).
"""

from __future__ import annotations


def printable(text: object) -> str:
    """``text`` (``str()`` of it) with each character a terminal could act on written as a
    Python string escape, as ``repr`` writes it: C0 controls and DEL (``\\x1b``, ``\\n``,
    ``\\r``, ``\\t``…), C1 controls (``\\x9b``), and the other characters that are not printable
    (format characters such as U+202E RIGHT-TO-LEFT OVERRIDE, separators, unassigned code
    points: ``\\u202e``). The space and every printable character are kept as they are."""
    value = str(text)
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)


def key_text(key: bytes | None) -> str:
    """A record's key as the writer gave it (the event's key, encoded as UTF-8); a byte that is
    not UTF-8 (a row another tool wrote) as ``\\xNN``. ``outboxkit outbox failed`` and the
    console show keys so (then through :func:`printable`)."""
    return "" if key is None else key.decode("utf-8", "backslashreplace")
