"""outboxkit against a secured Apache Kafka: TLS, SASL SCRAM and mutual TLS, ACLs enforced
(outboxkit/embedded/kafka_security.py). The relay and the inbox run as processes with exactly
the ACLs of outboxkit/preflight/kafka_acls.py (docs/security.md) and keep their guarantees; with one
ACL taken away, or a wrong password, an untrusted certificate or another host's certificate, they
stop at start with one line that says what is wrong. No output ever holds the password."""

from __future__ import annotations

import secrets
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest

from outboxkit.embedded._process import free_port
from outboxkit.embedded.kafka_security import SecuredKafkaCluster
from outboxkit.preflight.kafka_acls import CLUSTER, Acl, inbox_acls, relay_acls
from tests.helpers import http_client, run_cli, wait_for
from tests.integration.conftest import MakeTopic
from tests.integration.inbox_app import Payment
from tests.integration.inbox_harness import (
    InboxProcess,
    create_effects_table,
    effects,
    group_of,
    inbox_env,
    produce,
    wait_caught_up,
)
from tests.integration.relay_harness import (
    RelayProcess,
    Writers,
    check_guarantees,
    read_topic,
    register_topic,
    relay_env,
    relays,
    wait_pending,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


async def principal(kafka: SecuredKafkaCluster, acls: list[Acl]) -> tuple[str, str]:
    """A new SCRAM user with exactly ``acls``: (name, password)."""
    name, password = f"u-{uuid.uuid4().hex[:8]}", secrets.token_urlsafe(16) + "#@:/%"
    await kafka.add_scram_user(name, password)
    for acl in acls:
        await kafka.grant(
            f"User:{name}",
            acl.resource_type,
            CLUSTER if acl.resource_type == "CLUSTER" else acl.name,
            acl.operations,
            pattern=acl.pattern,
        )
    return name, password


async def login(
    kafka: SecuredKafkaCluster, auth: str, acls: list[Acl]
) -> tuple[dict[str, str], str]:
    """A new principal with exactly ``acls``, logging in by ``auth`` (``scram``: SASL_SSL
    SCRAM-SHA-512; ``mtls``: a client certificate): its ``OUTBOXKIT_KAFKA_*`` environment and
    the secret that must never be shown (the password, or the private key)."""
    if auth == "scram":
        user, password = await principal(kafka, acls)
        return kafka.environment(user), password
    client = f"c-{uuid.uuid4().hex[:8]}"
    for acl in acls:
        await kafka.grant(
            f"User:CN={client}", acl.resource_type, acl.name, acl.operations, pattern=acl.pattern
        )
    env = kafka.mtls_environment(client)
    _, key_file = kafka.client_cert(client)
    return env, key_file.read_bytes().splitlines()[1].decode()  # a line of the private key


def relay_environment(
    kafka: SecuredKafkaCluster, url: str, topic: str, name: str, user: str
) -> dict[str, str]:
    return {
        **relay_env(url, kafka.sasl_ssl_bootstrap, topic),
        "OUTBOXKIT_RELAY_NAME": name,
        **kafka.environment(user),
    }


async def relay_topic(
    make_topic: MakeTopic, url: str, prefix: str, partitions: int
) -> tuple[str, str]:
    """A new topic, registered for the writers, and a new relay name for it."""
    topic = await make_topic(prefix, partitions=partitions)
    await register_topic(url, topic, partitions)
    return topic, f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.mark.parametrize("auth", ["scram", "mtls"])
async def test_relay_with_only_its_acls_keeps_g1_g2_across_a_sigkill(
    auth: str,
    secured_kafka: SecuredKafkaCluster,
    make_secured_topic: MakeTopic,
    migrated_postgresql_url: str,
    tmp_path: Path,
) -> None:
    url = migrated_postgresql_url
    topic, name = await relay_topic(make_secured_topic, url, "relay", 2)
    kafka_env, secret = await login(
        secured_kafka, auth, relay_acls(f"outboxkit.relay.{name}", [topic])
    )
    env = {**relay_env(url, "", topic), "OUTBOXKIT_RELAY_NAME": name, **kafka_env}
    writers = Writers(url, topic, entities=8)
    with relays(tmp_path, env) as [first]:
        writers.start()
        await wait_for(lambda: writers.total >= 150, within=60, what="150 events written")
        await wait_for(lambda: "partitions assigned" in first.log(), within=60, what="assigned")
        first.signal(signal.SIGKILL)
        second = RelayProcess(tmp_path, env).start()
        try:
            target = writers.total + 150
            await wait_for(lambda: writers.total >= target, within=60, what="150 more")
            await writers.stop()
            await wait_pending(url, within=90)
        finally:
            second.kill()
        logs = first.log() + second.log()
    print(check_guarantees(writers, await read_topic(secured_kafka.plaintext_bootstrap, topic, 2)))
    assert secret not in logs


@pytest.mark.parametrize("auth", ["scram", "mtls"])
async def test_inbox_with_only_its_acls_takes_each_effect_once(
    auth: str,
    secured_kafka: SecuredKafkaCluster,
    make_secured_topic: MakeTopic,
    migrated_postgresql_url: str,
    tmp_path: Path,
) -> None:
    url = migrated_postgresql_url
    topic = await make_secured_topic("payments", partitions=2)
    admin = secured_kafka.plaintext_bootstrap
    await make_secured_topic(name=f"{topic}.dlq")  # the inbox refuses to start without it
    await create_effects_table(url)
    kafka_env, secret = await login(secured_kafka, auth, inbox_acls(group_of(topic), [topic]))
    events = [Payment(topic=topic, entity=f"e{i % 5}", seq=i) for i in range(40)]
    await produce(admin, [*events, *events[:10]])  # a re-delivery among them
    env = {**inbox_env(url, secured_kafka.sasl_ssl_bootstrap, topic), **kafka_env}
    worker = InboxProcess(tmp_path, env).start()
    try:
        await wait_caught_up(admin, group_of(topic), topic, 2, within=90, what="catch up")
        found = await effects(url)
        assert sorted(event_id for event_id, _, _ in found) == sorted(e.id for e in events)
        assert worker.terminate() == 0, worker.log()
    finally:
        worker.kill()
    assert secret not in worker.log()


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            "wrong password",
            "refused the login for user alice: check OUTBOXKIT_KAFKA_SASL_USERNAME and "
            "OUTBOXKIT_KAFKA_SASL_PASSWORD, and that the user has SCRAM-SHA-512 credentials",
        ),
        ("untrusted certificate", "is not trusted here"),
        ("another host's certificate", "is not valid for that host name"),
    ],
)
def test_a_connection_kafka_refuses_is_one_line_and_exit_1(
    case: str, expected: str, secured_kafka: SecuredKafkaCluster, migrated_postgresql_url: str
) -> None:
    env = {
        **secured_kafka.environment("alice"),
        "OUTBOXKIT_DATABASE_URL": migrated_postgresql_url,
        "OUTBOXKIT_TOPICS": "orders",
        "OUTBOXKIT_CONNECT_TIMEOUT": "5",
    }
    if case == "wrong password":
        env["OUTBOXKIT_KAFKA_SASL_PASSWORD"] = "not-it"
    elif case == "untrusted certificate":
        env["OUTBOXKIT_KAFKA_SSL_CA_FILE"] = ""  # the system's authorities
    else:
        env["OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS"] = secured_kafka.wrong_host_bootstrap
    for command in (("check",), ("relay",)):
        started = time.monotonic()
        result = run_cli(*command, env=env)
        output = result.stdout + result.stderr
        assert result.returncode == 1, output
        assert expected in output, output
        # Not waited for as an outage would be (OUTBOXKIT_STARTUP_GRACE, 60 s by default).
        assert time.monotonic() - started < 30, output
        assert "Traceback" not in output, output
        assert secured_kafka.users["alice"] not in output


def _without(acls: list[Acl], resource_type: str, operation: str) -> list[Acl]:
    """``acls`` with one operation taken away."""
    kept = []
    for acl in acls:
        operations = tuple(
            op for op in acl.operations if (acl.resource_type, op) != (resource_type, operation)
        )
        if operations:
            kept.append(Acl(acl.resource_type, acl.name, operations, acl.why, acl.pattern))
    return kept


RELAY_OPERATIONS = [
    (acl.resource_type, op) for acl in relay_acls("g", ["t"]) for op in acl.operations
]


def _refused_at_start(process: RelayProcess | InboxProcess, operation: str, resource: str) -> str:
    assert process.process is not None
    log = process.log()
    assert process.process.returncode == 1, log
    assert "Traceback" not in log, log
    [line] = [line for line in log.splitlines() if line.startswith("error:")]
    assert "Kafka does not allow" in line, log
    # Without its only ACL a topic cannot even be described (READ and WRITE imply DESCRIBE).
    assert operation in line or "DESCRIBE" in line, line
    assert resource in line, line
    return log


def _stopped(process: RelayProcess | InboxProcess) -> bool:
    return process.process is not None and process.process.poll() is not None


@pytest.mark.parametrize(("resource_type", "operation"), RELAY_OPERATIONS)
async def test_a_relay_missing_one_acl_says_which_at_start_and_exits_1(  # noqa: PLR0917
    resource_type: str,
    operation: str,
    secured_kafka: SecuredKafkaCluster,
    make_secured_topic: MakeTopic,
    migrated_postgresql_url: str,
    tmp_path: Path,
) -> None:
    url = migrated_postgresql_url
    topic, name = await relay_topic(make_secured_topic, url, "short", 1)
    group = f"outboxkit.relay.{name}"
    acls = _without(relay_acls(group, [topic]), resource_type, operation)
    user, password = await principal(secured_kafka, acls)
    env = relay_environment(secured_kafka, url, topic, name, user)
    relay = RelayProcess(tmp_path, env).start()
    try:
        await wait_for(lambda: _stopped(relay), within=60, what="the relay to refuse to start")
    finally:
        relay.kill()
    resource = {"TOPIC": topic, "GROUP": group, "TRANSACTIONAL_ID": group}[resource_type]
    assert password not in _refused_at_start(relay, operation, resource)


#: Each of the inbox's ACLs, by its place in the list: (index, resource type, operation).
INBOX_ACLS = [
    (i, acl.resource_type, operation)
    for i, acl in enumerate(inbox_acls("g", ["t"]))
    for operation in acl.operations
]


@pytest.mark.parametrize(("index", "resource_type", "operation"), INBOX_ACLS)
async def test_an_inbox_missing_one_acl_says_which_at_start_and_exits_1(  # noqa: PLR0917
    index: int,
    resource_type: str,
    operation: str,
    secured_kafka: SecuredKafkaCluster,
    make_secured_topic: MakeTopic,
    migrated_postgresql_url: str,
    tmp_path: Path,
) -> None:
    url = migrated_postgresql_url
    topic = await make_secured_topic("short", partitions=1)
    await make_secured_topic(name=f"{topic}.dlq")
    await create_effects_table(url)
    acls = inbox_acls(group_of(topic), [topic])
    removed = acls.pop(index)
    assert (removed.resource_type, removed.operations) == (resource_type, (operation,))
    user, password = await principal(secured_kafka, acls)
    env = {
        **inbox_env(url, secured_kafka.sasl_ssl_bootstrap, topic),
        **secured_kafka.environment(user),
    }
    worker = InboxProcess(tmp_path, env).start()
    try:
        await wait_for(lambda: _stopped(worker), within=60, what="the inbox to refuse to start")
    finally:
        worker.kill()
    assert password not in _refused_at_start(worker, operation, removed.name)


async def test_an_acl_revoked_while_the_relay_runs_shows_on_health_then_it_recovers(
    secured_kafka: SecuredKafkaCluster,
    make_secured_topic: MakeTopic,
    migrated_postgresql_url: str,
    tmp_path: Path,
) -> None:
    """Never a crash loop, never a silent stall: the relay keeps running, /healthz turns 503
    with the missing permission, and once the ACL is back everything committed meanwhile is
    published, in order."""
    url = migrated_postgresql_url
    topic, name = await relay_topic(make_secured_topic, url, "revoked", 1)
    user, password = await principal(secured_kafka, relay_acls(f"outboxkit.relay.{name}", [topic]))
    port = free_port()
    env = {
        **relay_environment(secured_kafka, url, topic, name, user),
        "OUTBOXKIT_HTTP_PORT": str(port),
        # A partition without progress for this long turns /healthz 503: short, so the revoked
        # ACL shows soon, but not so short that a relay starved of CPU (two test workers on two
        # cores) reads as stalled before it ever is.
        "OUTBOXKIT_STALL_AFTER": "5",
    }
    writers = Writers(url, topic, entities=4)
    async with http_client(base_url=f"http://127.0.0.1:{port}") as http:

        async def health() -> tuple[int, str]:
            try:
                response = await http.get("/healthz")
            except httpx.TransportError:
                return 0, ""
            return response.status_code, response.text

        last_seen = [""]

        async def status_is(code: int, text: str = "") -> bool:
            status, body = await health()
            last_seen[0] = f"{status} {body}"
            return status == code and text in body

        with relays(tmp_path, env) as [relay]:
            # A steady 50/s, not as fast as four writers go: flat out, a relay on TLS starved of
            # CPU by the other test worker fell behind by more than the stall limit, and its
            # /healthz rightly said so for a minute (a throughput limit, not this test's fault).
            writers.start(rate=50)
            try:
                await wait_for(lambda: status_is(200), within=60, what="a healthy relay")
            except AssertionError as exc:
                raise AssertionError(f"{exc}; /healthz said {last_seen[0][:1000]}") from None
            await wait_for(lambda: writers.total >= 50, within=30, what="50 events written")
            await secured_kafka.revoke(f"User:{user}", "TOPIC", topic, ["WRITE"])
            await wait_for(
                lambda: status_is(503, f"WRITE on Topic:{topic}"),
                within=60,
                what="/healthz to name the missing permission",
            )
            assert relay.process is not None
            assert relay.process.poll() is None, "the relay keeps running"
            await secured_kafka.grant(f"User:{user}", "TOPIC", topic, ["WRITE"])
            await writers.stop()
            await wait_pending(url, within=90, what="the backlog to drain")
            await wait_for(lambda: status_is(200), within=30, what="healthy again")
            shown = [relay.log(), (await health())[1], (await http.get("/metrics")).text]
            status = run_cli("relay", "status", env={**env, "OUTBOXKIT_HTTP_PORT": ""})
            assert status.returncode == 0, status.stdout + status.stderr
            shown.append(status.stdout + status.stderr)
    check_guarantees(writers, await read_topic(secured_kafka.plaintext_bootstrap, topic, 1))
    for text in shown:  # the log, /healthz, /metrics, `relay status`
        assert password not in text
    assert "partitions fenced" not in shown[0], "a missing ACL is not a fencing"


async def test_check_and_the_relay_name_every_missing_acl_in_one_run(
    secured_kafka: SecuredKafkaCluster, make_secured_topic: MakeTopic, migrated_postgresql_url: str
) -> None:
    """#44: `outboxkit check` passed what the relay then refused, and the relay named its
    missing ACLs one run at a time (a refused transactional id hid the topic's WRITE)."""
    url = migrated_postgresql_url
    topic, name = await relay_topic(make_secured_topic, url, "acls", 1)
    group = f"outboxkit.relay.{name}"
    acls = relay_acls(group, [topic])
    for resource_type, operation in (("GROUP", "READ"), ("TRANSACTIONAL_ID", "WRITE")):
        acls = _without(acls, resource_type, operation)
    acls = _without(acls, "TOPIC", "WRITE")  # READ stays: the topic can be described
    user, password = await principal(secured_kafka, acls)
    env = {
        **relay_environment(secured_kafka, url, topic, name, user),
        "OUTBOXKIT_STARTUP_GRACE": "0",
    }
    missing = [
        f"Kafka does not allow User:{user} READ on Group:{group}",
        f"Kafka does not allow User:{user} WRITE on TransactionalId:{group}.",
        f"Kafka does not allow User:{user} WRITE on Topic:{topic}",
    ]
    checked = run_cli("check", "--relay", env=env)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert [line for line in checked.stdout.splitlines() if line.startswith("FAIL acls")]
    for line in missing:
        assert line in checked.stdout, checked.stdout
    assert "ok   acls" not in checked.stdout
    started = run_cli("relay", env=env)
    assert started.returncode == 1, started.stderr
    for line in missing:
        assert line in started.stderr, started.stderr
    assert password not in checked.stdout + checked.stderr + started.stderr


async def test_check_names_every_acl_an_inbox_lacks(
    secured_kafka: SecuredKafkaCluster, make_secured_topic: MakeTopic, migrated_postgresql_url: str
) -> None:
    """#44: a topic the inbox may not even describe stopped the preflight before its other
    ACLs were looked at; `check --inbox` names them all."""
    topic = await make_secured_topic("acls", partitions=1)
    await make_secured_topic(name=f"{topic}.dlq")
    acls = [a for a in inbox_acls(group_of(topic), [topic]) if a.name != topic]  # no READ on it
    acls = [a for a in acls if a.resource_type != "GROUP"]
    user, password = await principal(secured_kafka, acls)
    env = {
        **inbox_env(migrated_postgresql_url, secured_kafka.sasl_ssl_bootstrap, topic),
        **secured_kafka.environment(user),
        "OUTBOXKIT_STARTUP_GRACE": "0",
    }
    checked = run_cli("check", "--inbox", topic, env=env)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert f"Kafka does not allow User:{user} READ on Topic:{topic}" in checked.stdout
    assert f"Kafka does not allow User:{user} READ on Group:{group_of(topic)}" in checked.stdout
    assert password not in checked.stdout + checked.stderr


async def test_an_inbox_missing_its_only_acl_on_a_topic_names_read_or_write(
    secured_kafka: SecuredKafkaCluster,
    make_secured_topic: MakeTopic,
    migrated_postgresql_url: str,
    tmp_path: Path,
) -> None:
    """#44 item 13: without its only ACL on a topic (READ on the source, WRITE on the dead-letter
    topic) the topic cannot be described, and the inbox said DESCRIBE, which `outboxkit acls
    inbox` never prints; the dead-letter WRITE was looked at only if DESCRIBE was granted."""
    url = migrated_postgresql_url
    topic = await make_secured_topic("only", partitions=1)
    dead_letters = await make_secured_topic(name=f"{topic}.dlq")
    await create_effects_table(url)
    acls = [a for a in inbox_acls(group_of(topic), [topic]) if a.resource_type == "GROUP"]
    user, password = await principal(secured_kafka, acls)
    env = {
        **inbox_env(url, secured_kafka.sasl_ssl_bootstrap, topic),
        **secured_kafka.environment(user),
        "OUTBOXKIT_STARTUP_GRACE": "0",
    }
    missing = [
        f"Kafka does not allow User:{user} READ on Topic:{topic}",
        f"Kafka does not allow User:{user} WRITE on Topic:{dead_letters}",
    ]
    checked = run_cli("check", "--inbox", topic, env=env)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    worker = InboxProcess(tmp_path, env).start()
    try:
        await wait_for(lambda: _stopped(worker), within=60, what="the inbox to refuse to start")
    finally:
        worker.kill()
    started = worker.log()
    for output in (checked.stdout, started):
        for line in missing:
            assert line in output, output
        assert "DESCRIBE" not in output, output
        assert password not in output


async def test_topics_create_without_describe_says_created_and_names_the_missing_acl(
    secured_kafka: SecuredKafkaCluster,
) -> None:
    """#44's finding: a principal allowed to CREATE topics but not to DESCRIBE them (CREATE does
    not imply DESCRIBE; READ, WRITE and ALTER do) had its topics created, then was told they did
    not exist and to create them. It must be told they were created, and which ACL is missing
    to show them; with DESCRIBE as well, the same command shows them."""
    topic = f"acl-create-{uuid.uuid4().hex[:8]}"
    user, password = await principal(
        secured_kafka, [Acl("TOPIC", "acl-create-", ("CREATE",), "create", "PREFIXED")]
    )
    env = {**secured_kafka.environment(user), "OUTBOXKIT_CONNECT_TIMEOUT": "5"}
    created = run_cli("topics", "create", topic, "--partitions", "2", env=env)
    output = created.stdout + created.stderr
    assert created.returncode == 1, output
    assert "does not exist" not in output, output
    assert "Traceback" not in output, output
    assert password not in output
    assert f"created {topic}, {topic}.dlq" in output, output
    assert f"Kafka does not allow User:{user} DESCRIBE on Topic:{topic}" in output, output

    await secured_kafka.grant(
        f"User:{user}", "TOPIC", "acl-create-", ("DESCRIBE",), pattern="PREFIXED"
    )
    again = run_cli("topics", "create", topic, "--partitions", "2", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"exists  {topic}: 2 partitions" in again.stdout, again.stdout
