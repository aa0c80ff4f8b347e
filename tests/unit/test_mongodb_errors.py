"""Which MongoDB errors outboxkit retries as an unavailable database: a failover's must be,
or a relay's worker crashes with a traceback when a primary steps down (issue #30)."""

from __future__ import annotations

import pytest
from pymongo.errors import (
    AutoReconnect,
    ConfigurationError,
    DuplicateKeyError,
    OperationFailure,
    ServerSelectionTimeoutError,
    WriteConcernError,
)

from outboxkit.core.mongodb import describe, is_transient, is_unavailable


def _write_concern_error(code: int, name: str) -> WriteConcernError:
    details = {"code": code, "codeName": name, "errmsg": "operation was interrupted"}
    return WriteConcernError(details["errmsg"], code, details)


@pytest.mark.parametrize(
    "error",
    [
        # What a delete_many with w:majority raised in a relay when its primary stepped down.
        _write_concern_error(11602, "InterruptedDueToReplStateChange"),
        _write_concern_error(91, "ShutdownInProgress"),
        OperationFailure("not primary", 10107),
        OperationFailure("stepped down", 189),
        AutoReconnect("connection reset"),
        # A pooled connection opened while its member was neither primary nor secondary.
        ConfigurationError("Sessions are not supported by this MongoDB deployment"),
    ],
)
def test_a_failover_is_an_unavailable_database(error: Exception) -> None:
    assert is_unavailable(error)
    assert not is_transient(error)  # no label: not a transaction to rerun by itself


@pytest.mark.parametrize(
    "error",
    [
        DuplicateKeyError("E11000 duplicate key", 11000),
        OperationFailure("bad query", 2),
        _write_concern_error(100, "UnsatisfiableWriteConcern"),
        ConfigurationError("Unknown option appname"),
    ],
)
def test_an_operation_error_is_not(error: Exception) -> None:
    assert not is_unavailable(error)


def test_a_server_selection_timeout_is_told_without_the_topology() -> None:
    """During an election every retry logged pymongo's whole topology description."""
    error = ServerSelectionTimeoutError(
        'No replica set members match selector "Primary()", Timeout: 10.0s, Topology '
        "Description: <TopologyDescription id: 6b07, topology_type: ReplicaSetNoPrimary, …>"
    )
    assert describe(error) == 'No replica set members match selector "Primary()", Timeout: 10.0s'
    assert describe(AutoReconnect("a\nb")) == "a"
