"""A relay on a standalone mongod (no replica set) publishes nothing, as docs/mongodb.md says:
the command refuses to start, and a relay run in code fails every claim, which mongod refuses.
There is no sweep-only mode."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from outboxkit.backends import backend_for
from outboxkit.backends.mongodb import REPLICA_SET_FIX
from outboxkit.embedded._process import free_port
from outboxkit.relay.mongodb import MongoOutboxStorage
from outboxkit.relay.records import TopicPartition
from outboxkit.relay.retry import RETRIABLE
from tests.docs_snippets import REPO
from tests.helpers import run_cli
from tests.integration.standalone_mongod import standalone_mongod

#: What the relay command prints (after the URL), and what mongod answers the relay's claim.
REFUSED = "is not a replica set"
SNAPSHOT_REFUSED = "node needs to be a replica set member to use readConcern: snapshot"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def standalone_url(tmp_path: Path) -> Iterator[str]:
    """``mongodb://127.0.0.1:<port>/shop`` on a mongod started without ``--replSet``."""
    with standalone_mongod(tmp_path) as port:
        yield f"mongodb://127.0.0.1:{port}/shop"


def _standalone_sentence() -> str:
    """docs/mongodb.md's sentence on a relay and a standalone mongod (the change-stream part)."""
    text = (REPO / "docs/mongodb.md").read_text()
    section = text.split("## The change stream is a wake-up, not the truth", 1)[1].split("\n## ")[0]
    [sentence] = [
        s for s in re.split(r"(?<=\.)\s+", " ".join(section.split())) if "standalone" in s
    ]
    return sentence


def test_the_documents_say_the_relay_refuses_a_standalone_mongod() -> None:
    sentence = _standalone_sentence()
    assert "sweep" not in sentence, sentence
    assert REFUSED in sentence
    assert SNAPSHOT_REFUSED in sentence


def test_the_relay_command_refuses_to_start(standalone_url: str) -> None:
    env = {
        "OUTBOXKIT_DATABASE_URL": standalone_url,
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}",  # nothing listens
        "OUTBOXKIT_TOPICS": "orders",
        "OUTBOXKIT_CONNECT_TIMEOUT": "2",
    }
    result = run_cli("relay", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"error: MongoDB at {standalone_url} {REFUSED}" in result.stderr


def test_migrate_refuses_a_standalone_mongod_with_the_relays_line(standalone_url: str) -> None:
    """#28: `outboxkit migrate` said `applied 0001_init, 0002_head_index` and exited 0 on a
    standalone mongod, which the relay and the writers then refuse. Catches a migrate that
    creates anything there, or says less than why and what to do."""
    env = {"OUTBOXKIT_DATABASE_URL": standalone_url, "OUTBOXKIT_CONNECT_TIMEOUT": "2"}
    result = run_cli("migrate", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        f"error: MongoDB at {standalone_url} {REFUSED}",
        f"  → {REPLICA_SET_FIX}",
    ]
    client: MongoClient[dict[str, object]] = MongoClient(standalone_url, timeoutMS=2000)
    with client:
        assert "outboxkit.migrations" not in client.shop.list_collection_names()
    # Behind a replicaSet URL, the check's line (the probe's) rather than a topology dump.
    behind = run_cli(
        "migrate", env=env | {"OUTBOXKIT_DATABASE_URL": f"{standalone_url}?replicaSet=rs0"}
    )
    assert behind.returncode == 1, behind.stdout + behind.stderr
    assert "is a standalone mongod, not a member of replica set rs0" in behind.stderr
    assert REPLICA_SET_FIX in behind.stderr


async def test_a_relay_in_code_fails_every_claim(standalone_url: str) -> None:
    # Created in code: `outboxkit migrate` refuses a standalone mongod.
    await backend_for(standalone_url).migrate(connect_timeout=2)
    async with MongoOutboxStorage(standalone_url, connect_timeout=2) as storage:
        for _ in range(2):  # not a passing state: the next claim meets the same refusal
            with pytest.raises(OperationFailure, match=SNAPSHOT_REFUSED) as refused:
                await storage.settle_and_claim([TopicPartition("orders", 0)], 10)
    # Not a retriable outage: the partition worker fails (and is restarted with backoff).
    assert not isinstance(refused.value, RETRIABLE)


def test_check_names_a_standalone_mongod_behind_a_replica_set_url(standalone_url: str) -> None:
    """#28: `?replicaSet=rs0` pointed at a standalone mongod waited 11.6 s and printed the
    driver's topology dump."""
    env = {
        "OUTBOXKIT_DATABASE_URL": f"{standalone_url}?replicaSet=rs0",
        "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "OUTBOXKIT_CONNECT_TIMEOUT": "5",
    }
    result = run_cli("check", env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "is a standalone mongod, not a member of replica set rs0" in output
    assert "TopologyDescription" not in output
