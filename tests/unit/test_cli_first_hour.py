"""The first hour's rough edges (#44), each through the real ``outboxkit`` entry point
(:func:`outboxkit.cli.main`) with the servers replaced by what they answered."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    GroupCoordinatorNotAvailableError,
    GroupIdNotFound,
    GroupLoadInProgressError,
    KafkaConnectionError,
    KafkaTimeoutError,
    NotCoordinatorForGroupError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)

from outboxkit.cli import main
from outboxkit.core.exceptions import CoordinatorNotReadyError
from outboxkit.core.kafka import with_coordinator
from outboxkit.core.settings import KafkaSettings
from outboxkit.embedded import free_port
from outboxkit.inbox.status import InboxStatus
from outboxkit.inbox.status import PartitionStatus as InboxPartition
from outboxkit.preflight.kafka_permissions import principal
from outboxkit.relay.ownership import describe_group
from outboxkit.relay.status import GroupStatus

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """``outboxkit <args>``: its exit code, stdout and stderr."""

    def run_(*args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exit_:
            main(list(args))
        captured = capsys.readouterr()
        code = exit_.value.code
        status = code if isinstance(code, int) else 0 if code is None else 1
        return status, captured.out, captured.err

    return run_


RELAY_STATUS = ("relay", "status", "--database-url", "postgresql://db/x", "--topics", "orders")
INBOX_STATUS = ("inbox", "status", "payments", "--topics", "orders")

#: Raw errors of the Kafka client that a status command can meet.
KAFKA_ERRORS = [
    GroupCoordinatorNotAvailableError("Unable to get coordinator id for outboxkit.relay.default"),
    GroupLoadInProgressError(),
    NotCoordinatorForGroupError(),
    CoordinatorNotReadyError("Kafka's coordinator of consumer group g is not ready after 10 s"),
    KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 9, <AddressFamily.AF_INET: 2>)]"),
    KafkaTimeoutError(),
    RequestTimedOutError(),
    GroupAuthorizationFailedError("outboxkit.relay.default"),
    UnknownTopicOrPartitionError(),
]


def _raising(exc: BaseException) -> Callable[..., Any]:
    def fail(*args: object, **kwargs: object) -> Any:
        raise exc

    return fail


@pytest.mark.parametrize("command", [RELAY_STATUS, INBOX_STATUS], ids=["relay", "inbox"])
@pytest.mark.parametrize("error", KAFKA_ERRORS, ids=lambda e: type(e).__name__)
def test_a_kafka_error_of_a_status_command_says_what_to_do(
    command: tuple[str, ...],
    error: Exception,
    run: Run,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """#44: `relay status` on a new cluster printed `error: [Error 15]
    GroupCoordinatorNotAvailableError: …` and nothing else."""
    monkeypatch.setattr("outboxkit.cli.relay.run_storage", _raising(error))

    async def read_status(*args: object, **kwargs: object) -> Any:
        raise error

    monkeypatch.setattr("outboxkit.cli.inbox.read_status", read_status)
    code, _, err = run(*command)
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith("error: "), err
    assert lines[1].startswith("  → "), err
    assert "Traceback" not in err
    if isinstance(error, GroupCoordinatorNotAvailableError | CoordinatorNotReadyError):
        assert "not ready" in lines[0], err
        assert "Retry in a few seconds" in lines[1], err


def test_relay_status_without_a_relay_says_none_runs(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    status = GroupStatus("outboxkit.relay.default", "Dead")
    monkeypatch.setattr("outboxkit.cli.relay.run_storage", lambda url, action: status)
    code, out, _ = run(*RELAY_STATUS)
    assert code == 0
    assert out.splitlines()[0] == "no relay of group outboxkit.relay.default is running"


async def test_a_coordinator_not_ready_is_asked_again() -> None:
    answers: list[BaseException | str] = [
        GroupCoordinatorNotAvailableError("Unable to get coordinator id for g"),
        GroupLoadInProgressError(),
        "described",
    ]

    async def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    assert await with_coordinator("g", call, within=5) == "described"


async def test_a_coordinator_never_ready_names_the_group() -> None:
    async def call() -> str:
        raise GroupCoordinatorNotAvailableError("Unable to get coordinator id for g")

    with pytest.raises(CoordinatorNotReadyError, match="consumer group g is not ready"):
        await with_coordinator("g", call, within=0)


class _Described:
    def __init__(self, code: int) -> None:
        self.groups: list[tuple[object, ...]] = [(code, "g", "Dead", "", "", [])]


class _Admin:
    def __init__(self, code: int) -> None:
        self.code = code

    async def describe_consumer_groups(self, groups: list[str]) -> list[_Described]:
        return [_Described(self.code)]


async def test_a_group_nobody_joined_is_dead_with_no_members() -> None:
    """Newer brokers answer GROUP_ID_NOT_FOUND where older ones said Dead."""
    admin: Any = _Admin(GroupIdNotFound.errno)
    assert await describe_group(admin, "g") == ("Dead", [])
    admin = _Admin(GroupCoordinatorNotAvailableError.errno)
    with pytest.raises(GroupCoordinatorNotAvailableError):
        await describe_group(admin, "g")


def test_debug_check_shows_the_exception_behind_each_failed_check(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#44: `outboxkit --debug check` printed no traceback, although README says --debug adds
    one."""
    monkeypatch.setenv("OUTBOXKIT_CONNECT_TIMEOUT", "2")
    closed = f"127.0.0.1:{free_port()}"
    database, kafka = f"postgresql://u@{closed}/db", closed
    args = ("check", "--database-url", database, "--kafka-bootstrap-servers", kafka)
    code, out, err = run(*args)
    assert code == 1
    assert "Traceback" not in err
    code, debug_out, err = run("--debug", *args)
    assert code == 1
    assert debug_out == out  # the same lines
    assert err.count("Traceback (most recent call last)") == 2, err
    assert "psycopg.OperationalError" in err
    assert "KafkaConnectionError" in err


def test_inbox_status_of_a_partition_never_committed_says_so(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#44: `offset None … progress - ago` for a partition with no committed offset."""

    def partition(n: int, offset: int | None, progress: float | None) -> InboxPartition:
        return InboxPartition(
            f"orders/{n}", offset, 35, 35 - (offset or 0), progress, None, None, False
        )

    status = InboxStatus(
        "outboxkit.inbox.payments",
        0,
        [partition(0, None, None), partition(1, 30, 1.5), partition(2, 35, None)],
    )

    async def read_status(*args: object, **kwargs: object) -> InboxStatus:
        return status

    monkeypatch.setattr("outboxkit.cli.inbox.read_status", read_status)
    code, out, _ = run(*INBOX_STATUS)
    assert code == 0
    assert out.splitlines() == [
        "no worker of group outboxkit.inbox.payments is running",
        "ok      orders/0 no committed offset yet, pending 35",
        "ok      orders/1 offset 30 pending 5, progress 1.5 s ago",
        "ok      orders/2 offset 35 pending 0, no progress recorded",
    ]
    assert "None" not in out


def test_the_mutual_tls_principal_is_the_certificates_subject(tmp_path: Path) -> None:
    """#44: a missing ACL of a mutual-TLS client said `User:CN=…`, with a literal `…`."""
    leaf = trustme.CA().issue_cert(
        "relay.invalid",
        common_name="relay",
        organization_name="Shop, Inc.",
        organization_unit_name="payments",
    )
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    settings = KafkaSettings(
        kafka_security_protocol="SSL", kafka_ssl_cert_file=cert, kafka_ssl_key_file=key
    )
    who = principal(settings)
    assert who.startswith("User:CN=relay,OU=payments,O=Shop\\, Inc. ("), who
    assert "…" not in who
    assert "ssl.principal.mapping.rules" in who
