"""The CloudEvents envelope (Kafka headers, binary content mode) read with Spark SQL.

Mirrors :func:`outboxkit.schemas.wire.read_envelope`, but only *recognises*: ``ok`` is true
when the headers are exactly in the form :func:`outboxkit.schemas.encode` writes — the seven
protocol headers first, in :data:`REQUIRED` order, each valid UTF-8; then ``ce_dataschema`` or
not (records written before it have none; its value is not read); then user headers, distinct,
valid UTF-8 and not named like protocol headers; ``ce_specversion`` ``1.0``, ``content-type``
``application/json``, ``ce_id`` a canonical lower-case UUID, ``ce_time``
``YYYY-MM-DDTHH:MM:SS.ffffffZ``, ``ce_schemaversion`` a positive integer, ``ce_type`` and
``ce_source`` not empty. The Python decoder accepts every such envelope with the same values.
When ``ok`` is false the record is left to the Python pass, which finds the exact reason (the
order of its checks matters: a malformed header is reported before a missing one).

Positional reads keep the common case cheap: Spark's lambda functions (``filter``,
``forall``) are interpreted, not code-generated, and looking each header up by name with them
made the decoder 20 times slower. None is used: the user headers are checked as whole arrays
(their keys and their values, ``headers.key`` and ``headers.value``), so that the decoder's
projection is compiled as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F

from outboxkit.schemas.wire import CONTENT_TYPE, DATA_SCHEMA_HEADER, SPEC_VERSION, WireHeader

REQUIRED = [
    WireHeader.SPEC_VERSION.value,
    WireHeader.ID.value,
    WireHeader.SOURCE.value,
    WireHeader.TYPE.value,
    WireHeader.TIME.value,
    WireHeader.SCHEMA_VERSION.value,
    WireHeader.CONTENT_TYPE.value,
]
_UUID = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\z"
# format_time's output; years 0002-9998 keep clear of Python's datetime range.
_TIME = (
    r"^(?!0000|0001|9999)[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}Z\z"
)
_VERSION = r"^[1-9][0-9]{0,9}\z"


#: A protocol header's name among user header names joined with newlines (lower-cased). A name
#: holding a newline may match where no name is reserved: the record then goes to the Python
#: pass, which decides it exactly.
_RESERVED = r"(^|\n)(ce_|content-type(\n|$))"
#: Not valid UTF-8: a user header with this value is rejected anyway, so looking it up tells
#: that no value is null (``array_contains`` is null when it finds none but meets a null).
_INVALID_UTF8 = bytearray(b"\xff")


@dataclass(frozen=True)
class Envelope:
    """Columns of a record's envelope; the values are meaningful only where ``ok`` is true."""

    ok: Column
    event_id: Column
    event_type: Column
    version: Column
    time: Column
    user_headers: Column
    """``map<string,string>`` of the user headers, in record order (build it only where ok)."""


def read_envelope(headers: Column) -> Envelope:
    """The envelope of the Kafka source's ``headers`` column (``includeHeaders``).

    Only the order :func:`~outboxkit.schemas.encode` writes is recognised — the seven protocol
    headers first, in :data:`REQUIRED` order, then the user headers — so that the common case
    costs a few positional reads; any other order is valid too, and is left to the Python pass.
    """
    count = F.size(headers)

    def text(index: int) -> Column:
        return F.get(headers, index)["value"].cast("string")

    protocol = F.lit(True)
    for index, name in enumerate(REQUIRED):
        value = F.get(headers, index)["value"]
        protocol = (
            protocol
            & (F.get(headers, index)["key"] == name)
            & value.isNotNull()
            & F.is_valid_utf8(value)
        )
    # ce_dataschema, where encode puts it, or no such header (an older writer's record).
    described = F.coalesce(F.get(headers, len(REQUIRED))["key"] == DATA_SCHEMA_HEADER, F.lit(False))
    first_user = F.when(described, F.lit(len(REQUIRED) + 1)).otherwise(F.lit(len(REQUIRED)))
    no_users = count == first_user
    # User headers (rare): distinct, valid UTF-8 and none that looks like a protocol header.
    user = F.slice(headers, first_user + 1, F.greatest(count - first_user, F.lit(1)))
    keys, values = user["key"], user["value"]
    texts = values.cast("array<string>")
    users_ok = F.when(no_users, F.lit(True)).otherwise(
        # No null name ("ce_" is reserved anyway), none reserved, all distinct…
        F.coalesce(~F.array_contains(keys, F.lit("ce_")), F.lit(False))
        & ~F.lower(F.array_join(keys, "\n")).rlike(_RESERVED)
        & (F.size(F.array_distinct(keys)) == F.size(user))
        # …and every value there and valid UTF-8: joined with an ASCII byte, the bytes are
        # valid UTF-8 exactly when each value is (an ASCII byte never continues a sequence).
        & F.coalesce(~F.array_contains(values, F.lit(_INVALID_UTF8)), F.lit(False))
        & F.is_valid_utf8(F.array_join(texts, "\n"))
    )
    position = {name: REQUIRED.index(name) for name in REQUIRED}
    event_id = text(position[WireHeader.ID])
    event_type = text(position[WireHeader.TYPE])
    version_text = text(position[WireHeader.SCHEMA_VERSION])
    time_text = text(position[WireHeader.TIME])
    time = time_text.try_cast("timestamp")
    ok = (
        (count >= len(REQUIRED))
        & protocol
        & (text(position[WireHeader.SPEC_VERSION]) == SPEC_VERSION)
        & (text(position[WireHeader.CONTENT_TYPE]) == CONTENT_TYPE)
        & event_id.rlike(_UUID)
        & time_text.rlike(_TIME)
        & time.isNotNull()
        & version_text.rlike(_VERSION)
        & (event_type != "")
        & (text(position[WireHeader.SOURCE]) != "")
        & users_ok
    )
    user_headers = F.when(no_users, F.create_map().cast("map<string,string>")).otherwise(
        F.map_from_arrays(keys, texts)
    )
    return Envelope(
        ok=F.coalesce(ok, F.lit(False)),
        event_id=event_id,
        event_type=event_type,
        version=version_text.try_cast("long"),
        time=time,
        user_headers=user_headers,
    )
