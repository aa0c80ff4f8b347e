"""How the relays under test reach Kafka (``--kafka-security``): PLAINTEXT or SASL_SSL.

Only the relays (and the Kafka-alone figures they are compared with: the ``ceiling`` producers
and ``idle``'s one-record transactions) use the listener being measured. The bench's own
clients (topic creation, group state, read-back, the latency consumer) always use the PLAINTEXT
listener: they measure the relay, not themselves.

With ``sasl_ssl`` the bench starts one :class:`~outboxkit.embedded.kafka_security.
SecuredKafkaCluster` and both kinds of context use it: PLAINTEXT relays its PLAINTEXT listener
(whose ANONYMOUS principal is a super user), SASL_SSL relays its SASL_SSL listener, so the two
figures differ by the listener only. Each SASL_SSL relay group logs in as its own SCRAM-SHA-512
user, created for it, that holds exactly :func:`outboxkit.preflight.kafka_acls.relay_acls` for
its group and topic. After each phase that ran over both, :func:`compare_security` prints each
compared figure of both protocols and the SASL_SSL/PLAINTEXT ratio, and adds them to the summary.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from bench.relay_bench.harness import (
    CEILING_TOPIC,
    Ctx,
    Result,
    ensure_topic,
    say,
    transactional_producer,
)
from outboxkit.embedded.kafka_security import (
    CLUSTER_RESOURCE,
    ScramMechanism,
    SecuredKafkaCluster,
)
from outboxkit.preflight.kafka_acls import relay_acls

#: ``--kafka-security`` values and how the summary names them.
SECURITIES = {"plaintext": "PLAINTEXT", "sasl_ssl": "SASL_SSL"}


class KafkaSecurity(Protocol):
    #: ``plaintext`` or ``sasl_ssl`` (a key of :data:`SECURITIES`).
    name: str

    @property
    def label(self) -> str:
        """PLAINTEXT or SASL_SSL."""

    def describe(self) -> str:
        """One line for the run's header: who connects how."""

    def client_options(self) -> dict[str, Any]:
        """aiokafka keyword arguments (servers, TLS, login) for the Kafka-alone figures measured
        beside the relays: the ceiling's producers and idle's one-record transactions."""

    async def relay_environment(self, group: str, topic: str) -> dict[str, str]:
        """The ``OUTBOXKIT_KAFKA_*`` variables of relay group ``group`` publishing ``topic``
        (SASL_SSL: its user is created and granted its ACLs on the first call)."""


class Plaintext:
    """The relays on the bench's own PLAINTEXT listener (the default, as before the option)."""

    name = "plaintext"

    def __init__(self, bootstrap: str, *, on_secured_broker: bool) -> None:
        self.bootstrap = bootstrap
        self.on_secured_broker = on_secured_broker

    @property
    def label(self) -> str:
        return SECURITIES[self.name]

    def describe(self) -> str:
        where = (
            "the secured broker's PLAINTEXT listener (ANONYMOUS, a super user)"
            if self.on_secured_broker
            else "PLAINTEXT, no authorizer"
        )
        return f"PLAINTEXT: relays on {where}"

    def client_options(self) -> dict[str, Any]:
        return {"bootstrap_servers": self.bootstrap}

    async def relay_environment(self, group: str, topic: str) -> dict[str, str]:
        return {"OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap}


class SaslSsl:
    """The relays on the secured broker's SASL_SSL listener, each group as its own SCRAM-SHA-512
    user with exactly ``relay_acls(group_id, [topic])``."""

    name = "sasl_ssl"
    mechanism: ClassVar[ScramMechanism] = "SCRAM-SHA-512"

    def __init__(self, cluster: SecuredKafkaCluster) -> None:
        self.cluster = cluster
        self._users: dict[tuple[str, str], str] = {}

    @property
    def label(self) -> str:
        return SECURITIES[self.name]

    def describe(self) -> str:
        return (
            f"SASL_SSL: {self.tls()} + {self.mechanism}; each relay group logs in as its own "
            "user holding exactly relay_acls(outboxkit.relay.<group>, [topic]) (least "
            "privilege, ACLs enforced); ceiling and Kafka-alone producers log in as admin"
        )

    def tls(self) -> str:
        """The TLS version and cipher a client of the SASL_SSL listener negotiates."""
        host, _, port = self.cluster.sasl_ssl_bootstrap.split(",")[0].rpartition(":")
        context = self.cluster.ssl_context()
        with (
            socket.create_connection((host, int(port)), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            cipher = tls.cipher()
            return f"{tls.version()} {cipher[0] if cipher else '?'} (CA from trustme)"

    def client_options(self) -> dict[str, Any]:
        return self.cluster.sasl_options(mechanism=self.mechanism)

    async def relay_environment(self, group: str, topic: str) -> dict[str, str]:
        user = self._users.get((group, topic))
        if user is None:
            user = f"relay-{group}"
            await self.cluster.add_scram_user(user, secrets.token_urlsafe(18), self.mechanism)
            for acl in relay_acls(f"outboxkit.relay.{group}", [topic]):
                await self.cluster.grant(
                    f"User:{user}",
                    acl.resource_type,
                    CLUSTER_RESOURCE if acl.resource_type == "CLUSTER" else acl.name,
                    acl.operations,
                    pattern=acl.pattern,
                )
            self._users[group, topic] = user
        return self.cluster.environment(user, mechanism=self.mechanism)


#: The warm-up before a comparison: transactions of WARM_UP_BATCH records over each listener.
WARM_UP_TRANSACTIONS, WARM_UP_BATCH = 40, 500


async def warm_up(ctxs: Sequence[Ctx]) -> None:
    """Unmeasured transactions over each context's listener before the first phase: otherwise
    the protocol that runs first meets a broker whose JIT has not compiled its path yet (in
    development runs the first protocol's ceiling came out 0.6x the second's, either way round,
    and the broker's CPU per record up to 2.4x)."""
    for ctx in ctxs:
        began = time.perf_counter()
        await ensure_topic(ctx, CEILING_TOPIC, ctx.args.partitions)
        producer = transactional_producer(ctx, "warm-up")
        await producer.start()
        try:
            for i in range(WARM_UP_TRANSACTIONS):
                await producer.begin_transaction()
                sent = [
                    await producer.send(
                        CEILING_TOPIC,
                        b"w" * 160,
                        key=b"warm-up-%d" % j,
                        partition=(i + j) % ctx.args.partitions,
                    )
                    for j in range(WARM_UP_BATCH)
                ]
                await asyncio.gather(*sent)
                await producer.commit_transaction()
        finally:
            await producer.stop()
        say(
            f"warm-up over {ctx.security.label}: {WARM_UP_TRANSACTIONS} transactions of "
            f"{WARM_UP_BATCH} records, unmeasured ({time.perf_counter() - began:.1f} s)"
        )


#: Per phase, the figures compared across protocols: (key in ``Ctx.figures`` or a ceiling, what,
#: kind, the issue's target for the SASL_SSL/PLAINTEXT ratio). ``{n}``: each drain relay count.
#: Kinds: a rate (its unit), ``latency`` (seconds, shown in ms), ``cpu`` (ms, shown in µs).
_COMPARED: dict[str, list[tuple[str, str, str, str]]] = {
    "ceiling": [
        ("ceiling plain", "aiokafka plain acks=all", "rec/s", ""),
        ("ceiling txn", "aiokafka txn/partition", "rec/s", ""),
        ("ceiling bench cpu", "aiokafka plain, client CPU per record", "cpu", ""),
        ("ceiling kafka cpu", "aiokafka plain, broker CPU per record", "cpu", ""),
    ],
    "drain": [
        (
            "drain {n} ev/s",
            "{n} relay(s), throughput",
            "ev/s",
            "target ≥ 0.80x (TLS ≤ 20% cost); SASL_SSL relays log in as SCRAM-SHA-512 users "
            "holding exactly relay_acls()",
        ),
        ("drain {n} cpu", "{n} relay(s), relay CPU per event", "cpu", ""),
        ("drain {n} kafka cpu", "{n} relay(s), broker CPU per event", "cpu", ""),
    ],
    "steady": [
        ("steady p50", "commit→consumer p50", "latency", ""),
        ("steady p99", "commit→consumer p99", "latency", ""),
        ("steady cpu", "relay CPU per event", "cpu", ""),
    ],
    "idle": [
        ("idle p50", "commit→consumer p50", "latency", ""),
        ("idle kafka alone", "Kafka alone, one-record txn p50", "latency", ""),
    ],
}
#: kind → (scale, decimals, unit shown)
_SHOWN = {"latency": (1000.0, 1, "ms"), "cpu": (1000.0, 1, "µs")}


def _figure(ctx: Ctx, key: str) -> float | None:
    if key == "ceiling plain":
        return ctx.ceiling_plain
    if key == "ceiling txn":
        return ctx.ceiling_txn
    return ctx.figures.get(key)


def compare_security(ctxs: Sequence[Ctx], phase: str, *, kafka_only: bool = False) -> None:
    """After ``phase`` ran over PLAINTEXT and SASL_SSL: each compared figure of both, and the
    SASL_SSL/PLAINTEXT ratio, printed and added to the summary after the phase's rows."""
    compared = _COMPARED.get(phase, [])
    for db in dict.fromkeys(c.database for c in ctxs):
        pair = {c.security.name: c for c in ctxs if c.database == db}
        plain, secured = pair.get("plaintext"), pair.get("sasl_ssl")
        if plain is None or secured is None:
            continue
        where = f" ({db})" if secured.labelled and not kafka_only else ""
        counts = sorted(plain.drain_rates.keys() & secured.drain_rates.keys())
        for key, what, kind, target in compared:
            scale, decimals, unit = _SHOWN.get(kind, (1.0, 0, kind))
            for n in counts if "{n}" in key else [0]:
                a = _figure(plain, key.format(n=n))
                b = _figure(secured, key.format(n=n))
                if a is None or b is None or not a > 0:
                    continue
                figure = f"{b * scale:,.{decimals}f} / {a * scale:,.{decimals}f} {unit}"
                case = f"{what.format(n=n)}, SASL_SSL / PLAINTEXT"
                say(f"{phase}{where}: {case} = {figure} = {b / a:.2f}x")
                secured.results.append(
                    Result(f"{phase}{where}", case, figure, f"{b / a:.2f}x", target)
                )
