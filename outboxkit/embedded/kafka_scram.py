"""The SCRAM credential requests aiokafka lacks (KIP-554: AlterUserScramCredentials,
DescribeUserScramCredentials; flexible versions only), for the secured test broker
(:mod:`.kafka_security`) to add users at run time."""

from __future__ import annotations

from typing import Any

from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    CompactArray,
    CompactBytes,
    CompactString,
    Int8,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)

#: (user, mechanism, iterations, salt, salted password, tagged fields)
Upsertion = tuple[str, int, int, bytes, bytes, dict[int, bytes]]


class _AlterScramResponseV0(Response):  # type: ignore[misc]
    API_KEY = 51
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "results",
            CompactArray(
                ("user", CompactString("utf-8")),
                ("error_code", Int16),
                ("error_message", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _AlterScramRequestV0(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 51
    API_VERSION = 0
    RESPONSE_TYPE = _AlterScramResponseV0
    SCHEMA = Schema(
        (
            "deletions",
            CompactArray(
                ("name", CompactString("utf-8")), ("mechanism", Int8), ("tags", TaggedFields)
            ),
        ),
        (
            "upsertions",
            CompactArray(
                ("name", CompactString("utf-8")),
                ("mechanism", Int8),
                ("iterations", Int32),
                ("salt", CompactBytes),
                ("salted_password", CompactBytes),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class AlterScram(Request[_AlterScramRequestV0]):  # type: ignore[misc]
    API_KEY = 51

    def __init__(self, upsertions: list[Upsertion]) -> None:
        self._upsertions = upsertions

    def build(self, request_struct_class: type[Any]) -> Any:
        return request_struct_class([], self._upsertions, {})


class _DescribeScramResponseV0(Response):  # type: ignore[misc]
    API_KEY = 50
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("error_message", CompactString("utf-8")),
        (
            "results",
            CompactArray(
                ("user", CompactString("utf-8")),
                ("error_code", Int16),
                ("error_message", CompactString("utf-8")),
                (
                    "credential_infos",
                    CompactArray(
                        ("mechanism", Int8), ("iterations", Int32), ("tags", TaggedFields)
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _DescribeScramRequestV0(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = 50
    API_VERSION = 0
    RESPONSE_TYPE = _DescribeScramResponseV0
    SCHEMA = Schema(
        ("users", CompactArray(("name", CompactString("utf-8")), ("tags", TaggedFields))),
        ("tags", TaggedFields),
    )


class DescribeScram(Request[_DescribeScramRequestV0]):  # type: ignore[misc]
    API_KEY = 50

    def __init__(self, users: list[tuple[str, dict[int, bytes]]]) -> None:
        self._users = users

    def build(self, request_struct_class: type[Any]) -> Any:
        return request_struct_class(self._users, {})
