"""A secured embedded Apache Kafka: TLS from a test CA, SASL (PLAIN, SCRAM), mutual TLS and ACLs.

:class:`SecuredKafkaCluster` is a :class:`~outboxkit.embedded.kafka.KafkaCluster` whose nodes
listen, besides PLAINTEXT and CONTROLLER, on

* ``SASL_SSL`` (:attr:`~SecuredKafkaCluster.sasl_ssl_bootstrap`): TLS with a broker certificate
  for ``127.0.0.1`` and ``localhost`` issued by a CA that ``trustme`` makes when the cluster is
  built (:attr:`~SecuredKafkaCluster.ca_file`), then SASL PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
  with the users given to the constructor (their SCRAM credentials are written when the storage
  is formatted: ``kafka-storage format --add-scram``);
* ``MTLS`` (:attr:`~SecuredKafkaCluster.mtls_bootstrap`): TLS that requires a client
  certificate from the same CA (:meth:`~SecuredKafkaCluster.client_cert`); the principal is the
  certificate's common name, ``User:CN=<name>`` (:func:`mtls_principal`);
* ``WRONG_HOST`` (:attr:`~SecuredKafkaCluster.wrong_host_bootstrap`): SASL_SSL like the first,
  but its certificate names only ``kafka.invalid``, so a client that checks host names refuses it.

Authorization is KRaft's ``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``:
a principal may do only what an ACL allows (:meth:`~SecuredKafkaCluster.grant`). The super users
are the SCRAM user ``admin`` and ``User:ANONYMOUS``. ANONYMOUS must be one because the CONTROLLER
and PLAINTEXT (inter-broker) listeners stay unauthenticated on 127.0.0.1, and the quorum and
replication requests arriving there are ANONYMOUS's. That is acceptable for a test broker only:
any client of :attr:`~outboxkit.embedded.kafka.KafkaCluster.bootstrap_servers` is an
administrator.

No tool jar is needed at run time: ACLs and SCRAM users are created with Kafka's own protocol
requests (CreateAcls, AlterUserScramCredentials) sent by an aiokafka client, and each call
returns once every broker enforces the change.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import secrets
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from aiokafka.errors import for_code
from aiokafka.protocol.admin import CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest
from pydantic import SecretStr

from outboxkit.core import kafka_clients
from outboxkit.core.exceptions import ConfigurationError
from outboxkit.core.settings import KafkaConnectionSettings
from outboxkit.embedded.kafka import KafkaCluster
from outboxkit.embedded.kafka_scram import AlterScram, DescribeScram, Upsertion

if TYPE_CHECKING:
    import trustme

__all__ = [
    "ADMIN_USER",
    "CLUSTER_RESOURCE",
    "WRONG_HOST_NAME",
    "AclOperation",
    "PatternType",
    "ResourceType",
    "SaslMechanism",
    "ScramMechanism",
    "SecuredKafkaCluster",
    "mtls_principal",
]

ScramMechanism = Literal["SCRAM-SHA-256", "SCRAM-SHA-512"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
ResourceType = Literal["TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID"]
AclOperation = Literal[
    "ALL",
    "READ",
    "WRITE",
    "CREATE",
    "DELETE",
    "ALTER",
    "DESCRIBE",
    "CLUSTER_ACTION",
    "DESCRIBE_CONFIGS",
    "ALTER_CONFIGS",
    "IDEMPOTENT_WRITE",
]
PatternType = Literal["LITERAL", "PREFIXED"]

#: The SCRAM super user that creates topics, ACLs and users.
ADMIN_USER = "admin"
#: The name of the one resource of type CLUSTER.
CLUSTER_RESOURCE = "kafka-cluster"
#: The only name in the WRONG_HOST listener's certificate.
WRONG_HOST_NAME = "kafka.invalid"

_SCRAM_MECHANISMS: tuple[ScramMechanism, ...] = ("SCRAM-SHA-256", "SCRAM-SHA-512")

# Kafka's wire codes (org.apache.kafka.common.resource / acl / ScramMechanism).
_RESOURCE_TYPES: dict[ResourceType, int] = {
    "TOPIC": 2,
    "GROUP": 3,
    "CLUSTER": 4,
    "TRANSACTIONAL_ID": 5,
}
_OPERATIONS: dict[AclOperation, int] = {
    "ALL": 2,
    "READ": 3,
    "WRITE": 4,
    "CREATE": 5,
    "DELETE": 6,
    "ALTER": 7,
    "DESCRIBE": 8,
    "CLUSTER_ACTION": 9,
    "DESCRIBE_CONFIGS": 10,
    "ALTER_CONFIGS": 11,
    "IDEMPOTENT_WRITE": 12,
}
_PATTERN_TYPES: dict[PatternType, int] = {"LITERAL": 3, "PREFIXED": 4}
_ANY_OPERATION = 1
_ALLOW = 3
_SCRAM_TYPES: dict[ScramMechanism, int] = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}
_SCRAM_ITERATIONS = 4096  # Kafka's minimum

# Names and passwords go unquoted into --add-scram, JAAS settings and a certificate subject.
_NAME = re.compile(r"[A-Za-z0-9._-]+")
_PASSWORD = re.compile(r"[A-Za-z0-9._~-]+")

#: An AlterUserScramCredentials upsertion: name, mechanism, iterations, salt, salted password, tags

#: How long a new ACL or SCRAM user may take to reach every broker's metadata.
_ENFORCED_WITHIN = 15.0

_SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


def mtls_principal(name: str) -> str:
    """The principal of a client that presents :meth:`SecuredKafkaCluster.client_cert` (name)."""
    return f"User:CN={name}"


class SecuredKafkaCluster(KafkaCluster):
    """A :class:`KafkaCluster` with TLS, SASL, mutual TLS and ACLs (see the module docstring).

    ``users`` maps SCRAM/PLAIN user names to passwords (``admin``, the super user, is added with
    a random password unless ``admin_password`` is given). Certificates are made in
    ``<base_dir>/tls`` when the object is built, so :attr:`ca_file` and :meth:`client_cert` work
    before :meth:`start`."""

    extra_listeners: ClassVar[Mapping[str, str]] = {
        "SASL_SSL": "SASL_SSL",
        "MTLS": "SSL",
        "WRONG_HOST": "SASL_SSL",
    }

    def __init__(
        self,
        size: int = 1,
        *,
        users: Mapping[str, str] | None = None,
        admin_password: str | None = None,
        jars_dir: Path | None = None,
        base_dir: Path | None = None,
        heap: str = "512m",
        extra_config: dict[str, str] | None = None,
        quick_jvm: bool = False,
    ) -> None:
        #: Password of each SASL user; PLAIN knows only those given here, SCRAM also those
        #: :meth:`add_scram_user` adds.
        self.users: dict[str, str] = {
            ADMIN_USER: admin_password or secrets.token_urlsafe(16),
            **(users or {}),
        }
        for name, password in self.users.items():
            _check_name(name)
            if not _PASSWORD.fullmatch(password):
                raise ConfigurationError(
                    f"the password of Kafka user {name!r} may hold only letters, digits and ._~-"
                )
        super().__init__(
            size,
            jars_dir=jars_dir,
            base_dir=base_dir,
            heap=heap,
            extra_config=extra_config,
            quick_jvm=quick_jvm,
        )
        self.tls_dir = self.base_dir / "tls"
        self.tls_dir.mkdir(exist_ok=True)
        self._ca = _new_ca()
        self.ca_file = self.tls_dir / "ca.pem"
        self._ca.cert_pem.write_to_path(str(self.ca_file))
        self._client_certs: dict[str, tuple[Path, Path]] = {}
        # The cluster's settings first: a caller's extra_config may override any of them.
        self.extra_config = {**self._security_config(), **self.extra_config}

    # --- what clients connect to ------------------------------------------------------------

    @property
    def sasl_ssl_bootstrap(self) -> str:
        """Bootstrap servers of the SASL_SSL listener (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)."""
        return self.listener_bootstrap("SASL_SSL")

    @property
    def mtls_bootstrap(self) -> str:
        """Bootstrap servers of the SSL listener that requires a client certificate."""
        return self.listener_bootstrap("MTLS")

    @property
    def wrong_host_bootstrap(self) -> str:
        """Bootstrap servers of a SASL_SSL listener whose certificate is for another host."""
        return self.listener_bootstrap("WRONG_HOST")

    @property
    def plaintext_bootstrap(self) -> str:
        """Bootstrap servers of the unauthenticated PLAINTEXT listener, whose clients are super
        users (User:ANONYMOUS): for administration only."""
        return self.bootstrap_servers

    def client_cert(self, name: str) -> tuple[Path, Path]:
        """(certificate chain, private key) PEM files of a client certificate for ``name``,
        issued by the cluster's CA; its principal on the MTLS listener is
        :func:`mtls_principal` (name)."""
        if name not in self._client_certs:
            _check_name(name)
            leaf = self._ca.issue_cert(
                f"{name}.client.invalid",
                common_name=name,
                organization_name="outboxkit tests",
                organization_unit_name="embedded Kafka clients",
            )
            cert, key = self.tls_dir / f"client-{name}.pem", self.tls_dir / f"client-{name}.key"
            leaf.private_key_pem.write_to_path(str(key))
            cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
            self._client_certs[name] = (cert, key)
        return self._client_certs[name]

    def ssl_context(self, client: str | None = None) -> ssl.SSLContext:
        """A context that trusts the cluster's CA and checks host names (as aiokafka's
        ``create_ssl_context`` makes it), presenting ``client``'s certificate if given."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if client is not None:
            cert, key = self.client_cert(client)
            context.load_cert_chain(cert, key)
        return context

    def sasl_options(
        self,
        user: str = ADMIN_USER,
        *,
        mechanism: SaslMechanism = "SCRAM-SHA-512",
        password: str | None = None,
    ) -> dict[str, Any]:
        """Keyword arguments for an aiokafka client of the SASL_SSL listener as ``user``."""
        return {
            "bootstrap_servers": self.sasl_ssl_bootstrap,
            "security_protocol": "SASL_SSL",
            "ssl_context": self.ssl_context(),
            "sasl_mechanism": mechanism,
            "sasl_plain_username": user,
            "sasl_plain_password": self.users[user] if password is None else password,
        }

    def environment(
        self, user: str = ADMIN_USER, *, mechanism: SaslMechanism = "SCRAM-SHA-512"
    ) -> dict[str, str]:
        """outboxkit's ``OUTBOXKIT_KAFKA_*`` settings for the SASL_SSL listener as ``user``."""
        return {
            "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": self.sasl_ssl_bootstrap,
            "OUTBOXKIT_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "OUTBOXKIT_KAFKA_SASL_MECHANISM": mechanism,
            "OUTBOXKIT_KAFKA_SASL_USERNAME": user,
            "OUTBOXKIT_KAFKA_SASL_PASSWORD": self.users[user],
            "OUTBOXKIT_KAFKA_SSL_CA_FILE": str(self.ca_file),
        }

    def mtls_environment(self, client: str) -> dict[str, str]:
        """outboxkit's ``OUTBOXKIT_KAFKA_*`` settings for the mutual-TLS listener as ``client``."""
        cert, key = self.client_cert(client)
        return {
            "OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS": self.mtls_bootstrap,
            "OUTBOXKIT_KAFKA_SECURITY_PROTOCOL": "SSL",
            "OUTBOXKIT_KAFKA_SSL_CA_FILE": str(self.ca_file),
            "OUTBOXKIT_KAFKA_SSL_CERT_FILE": str(cert),
            "OUTBOXKIT_KAFKA_SSL_KEY_FILE": str(key),
        }

    def settings(
        self, user: str = ADMIN_USER, *, mechanism: SaslMechanism = "SCRAM-SHA-512"
    ) -> KafkaConnectionSettings:
        """outboxkit's Kafka settings for the SASL_SSL listener as ``user``."""
        env = self.environment(user, mechanism=mechanism)
        return KafkaConnectionSettings(
            kafka_bootstrap_servers=[env["OUTBOXKIT_KAFKA_BOOTSTRAP_SERVERS"]],
            kafka_security_protocol="SASL_SSL",
            kafka_sasl_mechanism=mechanism,
            kafka_sasl_username=user,
            kafka_sasl_password=SecretStr(self.users[user]),
            kafka_ssl_ca_file=self.ca_file,
        )

    # --- administration ----------------------------------------------------------------------

    async def grant(
        self,
        principal: str,
        resource_type: ResourceType,
        name: str,
        operations: Iterable[AclOperation],
        *,
        pattern: PatternType = "LITERAL",
        host: str = "*",
    ) -> None:
        """Allow ``principal`` (``User:alice``, ``User:CN=relay``) ``operations`` on a resource
        (``name`` is :data:`CLUSTER_RESOURCE` for CLUSTER; a prefix if ``pattern`` is
        PREFIXED). Returns once every broker enforces the new ACLs."""
        if resource_type == "CLUSTER" and name != CLUSTER_RESOURCE:
            raise ConfigurationError(f"the CLUSTER resource is named {CLUSTER_RESOURCE!r}")
        await self._change_acls(
            "grant", principal, (resource_type, name, pattern), operations, host
        )

    async def revoke(
        self,
        principal: str,
        resource_type: ResourceType,
        name: str,
        operations: Iterable[AclOperation],
        *,
        pattern: PatternType = "LITERAL",
        host: str = "*",
    ) -> None:
        """Take back what :meth:`grant` gave; returns once no broker enforces it any more."""
        await self._change_acls(
            "revoke", principal, (resource_type, name, pattern), operations, host
        )

    async def _change_acls(
        self,
        change: Literal["grant", "revoke"],
        principal: str,
        target: tuple[ResourceType, str, PatternType],
        operations: Iterable[AclOperation],
        host: str,
    ) -> None:
        changed = {_OPERATIONS[op] for op in operations}
        resource_type, name, pattern = target
        resource = (_RESOURCE_TYPES[resource_type], name, _PATTERN_TYPES[pattern])
        async with self._admin_client() as client:
            for operation in sorted(changed):
                acl = (*resource, principal, host, operation, _ALLOW)
                if change == "grant":
                    response = await client.send(client.get_random_node(), CreateAclsRequest(*acl))
                    errors = [(code, message) for code, message in response.creation_responses]
                else:
                    response = await client.send(client.get_random_node(), DeleteAclsRequest(*acl))
                    errors = [(code, message) for code, message, *_ in response.filter_responses]
                for error_code, message in errors:
                    if error_code:
                        raise for_code(error_code)(message)

            async def in_effect(node_id: int) -> bool:
                request = DescribeAclsRequest(*resource, principal, host, _ANY_OPERATION, _ALLOW)
                response = await client.send(node_id, request)
                if response.error_code:
                    raise for_code(response.error_code)(response.error_message)
                seen = {acl[2] for res in response.resources for acl in res[3]}
                return changed <= seen if change == "grant" else not changed & seen

            await _on_every_broker(client, in_effect, f"{change} of ACLs of {principal} on {name}")

    async def add_scram_user(
        self, name: str, password: str, mechanism: ScramMechanism = "SCRAM-SHA-512"
    ) -> None:
        """Create (or change) a SCRAM credential at run time; returns once every broker accepts
        it. The user is known to SASL PLAIN only if given to the constructor."""
        _check_name(name)
        salt = secrets.token_bytes(16)
        digest = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
        salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, _SCRAM_ITERATIONS)
        upsertion: Upsertion = (name, _SCRAM_TYPES[mechanism], _SCRAM_ITERATIONS, salt, salted, {})
        async with self._admin_client() as client:
            response = await client.send(client.get_random_node(), AlterScram([upsertion]))
            for _, error_code, message, _tags in response.results:
                if error_code:
                    raise for_code(error_code)(message)

            async def known(node_id: int) -> bool:
                response = await client.send(node_id, DescribeScram([(name, {})]))
                return any(
                    error_code == 0 and any(info[0] == _SCRAM_TYPES[mechanism] for info in infos)
                    for _, error_code, _message, infos, _tags in response.results
                )

            await _on_every_broker(client, known, f"SCRAM user {name}")
        self.users[name] = password

    @contextlib.asynccontextmanager
    async def _admin_client(self) -> AsyncIterator[Any]:
        client = kafka_clients.client(self.settings(ADMIN_USER))
        try:
            await client.bootstrap()
            yield client
        finally:
            await client.close()

    # --- broker settings --------------------------------------------------------------------

    def format_arguments(self) -> list[str]:
        return [
            argument
            for name, password in self.users.items()
            for mechanism in _SCRAM_MECHANISMS
            for argument in ("--add-scram", f"{mechanism}=[name={name},password={password}]")
        ]

    def _security_config(self) -> dict[str, str]:
        broker = self._ca.issue_cert("127.0.0.1", "localhost", common_name="embedded-kafka")
        wrong_host = self._ca.issue_cert(WRONG_HOST_NAME, common_name=WRONG_HOST_NAME)
        plain_users = " ".join(f'user_{name}="{pw}"' for name, pw in self.users.items())
        config = {
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            # ANONYMOUS: the PLAINTEXT (inter-broker) and CONTROLLER listeners on 127.0.0.1 are
            # unauthenticated, and the brokers' and controllers' own requests must pass. A test
            # broker only; a real one authenticates these listeners too.
            "super.users": f"User:ANONYMOUS;User:{ADMIN_USER}",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            # The broker's key and chain go inline (PEM, unencrypted): no password, no keystore.
            "ssl.keystore.type": "PEM",
            **_keystore("", broker),
            **_keystore("listener.name.wrong_host.", wrong_host),
            "listener.name.mtls.ssl.client.auth": "required",
            # The principal of a client certificate "CN=relay,OU=…,O=…" is User:CN=relay.
            "ssl.principal.mapping.rules": "RULE:^(CN=[^,]+),.*$/$1/,DEFAULT",
        }
        for listener in ("sasl_ssl", "wrong_host"):
            config[f"listener.name.{listener}.plain.sasl.jaas.config"] = (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
            )
            for mechanism in _SCRAM_MECHANISMS:
                config[f"listener.name.{listener}.{mechanism.lower()}.sasl.jaas.config"] = (
                    _SCRAM_LOGIN
                )
        return config


def _new_ca() -> trustme.CA:
    try:
        import trustme  # noqa: PLC0415 - a test dependency, needed only by a secured cluster
    except ImportError as exc:
        raise ConfigurationError(
            "a secured embedded Kafka needs trustme: pip install 'outboxkit[embedded]'"
        ) from exc
    return trustme.CA(organization_name="outboxkit embedded Kafka CA")


def _keystore(prefix: str, leaf: trustme.LeafCert) -> dict[str, str]:
    """PEM keystore settings for one certificate: the key as PKCS#8 (what Kafka reads)."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415 - with trustme

    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    pkcs8 = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    chain = b"".join(blob.bytes() for blob in leaf.cert_chain_pems)
    return {
        f"{prefix}ssl.keystore.key": _properties_value(pkcs8),
        f"{prefix}ssl.keystore.certificate.chain": _properties_value(chain),
    }


def _properties_value(pem: bytes) -> str:
    """A multi-line PEM as one line of a Java properties file (``\\n`` escapes)."""
    return pem.decode("ascii").strip().replace("\n", "\\n")


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"Kafka user or client name {name!r} may hold only letters, digits and ._-"
        )


async def _on_every_broker(
    client: Any, condition: Callable[[int], Awaitable[bool]], what: str
) -> None:
    """Wait until ``condition(node_id)`` holds for every broker of the cluster."""
    try:
        async with asyncio.timeout(_ENFORCED_WITHIN):
            for broker in client.cluster.brokers():
                # The broker answers from its own copy of the metadata: ask until it has it.
                while True:
                    if await condition(broker.nodeId):
                        break
                    await asyncio.sleep(0.02)
    except TimeoutError:
        raise TimeoutError(
            f"{what}: not in effect on every broker after {_ENFORCED_WITHIN:.0f} s"
        ) from None
