"""A real Apache Kafka broker (KRaft, combined broker+controller nodes) run from its jars.

The jars come from Maven Central (``outboxkit dev jars`` puts them in
``~/.cache/outboxkit/kafka-<version>``, see :mod:`outboxkit.embedded.kafka_jars`); Java 17 runs
them. A cluster of one node serves most
tests; three nodes serve replication tests. Every node keeps its ports and data across
:meth:`KafkaNode.stop` / :meth:`KafkaNode.start`, so a test can restart a broker under load.
"""

from __future__ import annotations

import base64
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar, Self

from outboxkit.core.exceptions import ConfigurationError
from outboxkit.embedded._process import (
    ManagedServer,
    ServerProcess,
    ServerStartError,
    free_port,
    port_is_open,
    spawn,
    stop_process,
    wait_until,
)
from outboxkit.embedded.class_archive import archive_options, class_archive
from outboxkit.embedded.kafka_jars import DEFAULT_KAFKA_VERSION, kafka_jars_dir

__all__ = ["DEFAULT_KAFKA_VERSION", "KafkaCluster", "KafkaNode", "kafka_jars_dir"]

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.org.name = org.apache.kafka
logger.org.level = WARN
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


def _kafka_uuid() -> str:
    """A random id in Kafka's own form (URL-safe base64 of 16 bytes, unpadded)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


class KafkaNode(ServerProcess):
    """One combined broker+controller process of a :class:`KafkaCluster`."""

    def __init__(self, cluster: KafkaCluster, node_id: int, base_dir: Path) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.dir = base_dir
        self.port = free_port()
        self.controller_port = free_port()
        #: Ports of the listeners the cluster adds to PLAINTEXT (e.g. the secured ones), by name.
        self.listener_ports = {name: free_port() for name in cluster.extra_listeners}
        #: Listeners advertised on another port than their own, by name: a TCP proxy's in
        #: front of them (network-fault tests), so that clients reconnect through the proxy.
        #: Set before :meth:`KafkaCluster.start`.
        self.advertised_ports: dict[str, int] = {}
        self.config_path = self.dir / "server.properties"
        self.log_path = self.dir / "server.log"

    @property
    def address(self) -> str:
        """``host:port`` of the PLAINTEXT listener."""
        return f"127.0.0.1:{self.port}"

    def listener_address(self, listener: str) -> str:
        """``host:port`` of one of the cluster's :attr:`~KafkaCluster.extra_listeners`."""
        return f"127.0.0.1:{self.listener_ports[listener]}"

    def write_config(self) -> None:
        size = len(self.cluster.nodes)
        replicas = min(3, size)
        # PLAINTEXT is also the inter-broker listener; each listener advertises itself, so a
        # client that bootstraps on one listener stays on it.
        ports = {"PLAINTEXT": self.port, **self.listener_ports}
        listening = ",".join(f"{name}://127.0.0.1:{port}" for name, port in ports.items())
        advertised = ",".join(
            f"{name}://127.0.0.1:{self.advertised_ports.get(name, port)}"
            for name, port in ports.items()
        )
        protocols = {
            "PLAINTEXT": "PLAINTEXT",
            "CONTROLLER": "PLAINTEXT",
            **self.cluster.extra_listeners,
        }
        config = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "listeners": f"{listening},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": advertised,
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": ",".join(f"{n}:{p}" for n, p in protocols.items()),
            # A static quorum: every node knows every voter, no dynamic-quorum bootstrapping.
            "controller.quorum.voters": ",".join(
                f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.cluster.nodes
            ),
            "log.dirs": str(self.dir / "data"),
            "num.partitions": "1",
            "default.replication.factor": str(replicas),
            "min.insync.replicas": str(min(2, replicas)),
            "offsets.topic.replication.factor": str(replicas),
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": str(min(2, replicas)),
            "transaction.state.log.num.partitions": "10",
            "group.initial.rebalance.delay.ms": "0",
            # Short timeouts make failover quick: consumer groups, and a killed broker's
            # partitions get a new leader about 3 s after its last heartbeat.
            "group.min.session.timeout.ms": "1000",
            "broker.heartbeat.interval.ms": "500",
            "broker.session.timeout.ms": "3000",
            # A follower that is alive but behind (a restarted JVM starved of CPU) leaves the ISR
            # after this long, not Kafka's 30 s: until then every acks=all write to its
            # partitions waits for it, offset commits and group joins included (the failover
            # tests saw 31-34 s stalls right after a broker rejoined).
            "replica.lag.time.max.ms": "10000",
            # The active controller appends a no-op record to the metadata log this often when
            # nothing else happens (KIP-835: a quorum-health signal for monitoring). Kafka's
            # 500 ms made up 40 % of an idle node's CPU (0.030 → 0.018 core-s per second); no
            # election, fencing or metadata propagation waits for these records.
            "metadata.max.idle.interval.ms": "10000",
            # outboxkit expects topics to exist; a typo must fail, not create a topic.
            "auto.create.topics.enable": "false",
            **self.cluster.extra_config,
        }
        self.dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in config.items()))

    def format(self) -> None:
        if (self.dir / "data" / "meta.properties").exists():
            return
        command = [
            *self.cluster.java_command(),
            "kafka.tools.StorageTool",
            "format",
            # One argument with '=': a random id may start with '-' (1 in 64), which the tool's
            # argparse would take for an option ("--cluster-id: expected one argument").
            f"--cluster-id={self.cluster.cluster_id}",
            "--config",
            str(self.config_path),
            "--ignore-formatted",  # a second attempt after a partial first one
            *self.cluster.format_arguments(),
        ]
        # One retry: a JVM that fails to start while two other nodes format on two busy cores
        # is the machine's hiccup, not a configuration error.
        for _ in range(2):
            result = subprocess.run(command, capture_output=True, text=True, check=False)
            if result.returncode == 0:
                return
        raise ServerStartError(
            f"formatting Kafka node {self.node_id} failed twice "
            f"(exit {result.returncode}):\n{result.stdout}{result.stderr}"
        )

    def launch(self) -> None:
        if self.running:
            return
        self._process = spawn(
            [*self.cluster.java_command(), "kafka.Kafka", str(self.config_path)],
            log_path=self.log_path,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        def started() -> bool:
            return port_is_open(self.port) and "Kafka Server started" in self.log_path.read_text(
                errors="replace"
            )

        wait_until(
            started,
            timeout=timeout,
            what=f"Kafka node {self.node_id} on port {self.port}",
            process=self._process,
            log_path=self.log_path,
        )

    def start(self, timeout: float = 60.0) -> None:
        """Start (again) on the same ports and data."""
        if self.running:
            return
        self.log_path.unlink(missing_ok=True)
        self.launch()
        self.wait_ready(timeout)

    def stop(self, *, timeout: float = 60.0) -> None:
        """Controlled shutdown (SIGTERM): leadership moves, logs are flushed."""
        if self._process is not None:
            stop_process(self._process, signal.SIGTERM, timeout=timeout)
            self._process = None

    def kill(self) -> None:
        """SIGKILL: the broker dies as on a power cut."""
        if self._process is not None:
            stop_process(self._process, signal.SIGKILL, timeout=10)
            self._process = None


class KafkaCluster(ManagedServer):
    """``size`` KRaft nodes on free ports of 127.0.0.1, data in ``base_dir`` (a temporary
    directory by default). Use as a context manager, or :meth:`start` / :meth:`close`.

    Every node listens on PLAINTEXT (clients and inter-broker traffic) and CONTROLLER (the KRaft
    quorum); a subclass adds listeners (:attr:`extra_listeners`) and storage-format arguments
    (:meth:`format_arguments`), as :class:`~outboxkit.embedded.kafka_security.SecuredKafkaCluster`
    does for TLS, SASL and ACLs."""

    #: Listeners every node has besides PLAINTEXT and CONTROLLER: name → security protocol.
    extra_listeners: ClassVar[Mapping[str, str]] = {}

    def __init__(
        self,
        size: int = 1,
        *,
        jars_dir: Path | None = None,
        base_dir: Path | None = None,
        heap: str = "512m",
        extra_config: dict[str, str] | None = None,
        quick_jvm: bool = False,
        share_classes: bool = True,
    ) -> None:
        """``quick_jvm``: HotSpot's C1 compiler only and the serial GC, for short runs (tests):
        a 3-node cluster started in 5.6 s instead of 8.9 s here, with a third less CPU, but
        slower code once warm, so benchmarks keep the default.

        ``share_classes``: the JVMs map a class-data-sharing archive of Kafka's classes
        (:mod:`~outboxkit.embedded.class_archive`), made in ``jars_dir`` by the first start
        (one broker run, a few seconds): a node is then ready in about half the time, on
        ~40% less CPU."""
        if size < 1:
            raise ConfigurationError("a Kafka cluster needs at least one node")
        self.jars_dir = jars_dir or kafka_jars_dir()
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="outboxkit-kafka-"))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.heap = heap
        self.quick_jvm = quick_jvm
        self.share_classes = share_classes
        #: Options added to every JVM of the cluster (the class archive's, once started).
        self.jvm_options: list[str] = []
        self.extra_config = dict(extra_config or {})
        self.cluster_id = _kafka_uuid()
        self.nodes: list[KafkaNode] = []
        self.nodes.extend(
            KafkaNode(self, i + 1, self.base_dir / f"node{i + 1}") for i in range(size)
        )
        (self.base_dir / "log4j2.properties").write_text(_LOG4J2)

    @property
    def bootstrap_servers(self) -> str:
        """Bootstrap servers of the PLAINTEXT listener."""
        return ",".join(node.address for node in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        """The node whose ``node.id`` is ``node_id`` (as Kafka's metadata and
        :mod:`~outboxkit.embedded.kafka_topology` name brokers)."""
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no Kafka node {node_id} in this cluster")

    def listener_bootstrap(self, listener: str) -> str:
        """Bootstrap servers of one of the :attr:`extra_listeners`."""
        return ",".join(node.listener_address(listener) for node in self.nodes)

    def format_arguments(self) -> list[str]:
        """Extra arguments for ``kafka-storage format`` (e.g. ``--add-scram``)."""
        return []

    def _java(self) -> str:
        java = shutil.which("java")
        if java is None:
            raise ConfigurationError(
                "Apache Kafka needs Java 17: apt-get install openjdk-17-jre-headless"
            )
        return java

    def _jars(self) -> list[Path]:
        # Listed, not "dir/*": a class archive holds the classpath it was made with, and the
        # JVM expands a wildcard in directory order.
        return sorted(self.jars_dir.glob("*.jar"))

    def _compiler_and_gc(self) -> list[str]:
        return (
            ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"] if self.quick_jvm else ["-XX:+UseG1GC"]
        )

    def java_command(self) -> list[str]:
        return [
            self._java(),
            *self.jvm_options,
            f"-Xmx{self.heap}",
            "-Xms128m",
            *self._compiler_and_gc(),
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.base_dir / 'log4j2.properties'}",
            "-cp",
            ":".join(map(str, self._jars())),
        ]

    def _class_archive(self) -> Path | None:
        def train(options: list[str]) -> None:
            trainer = KafkaCluster(
                1, jars_dir=self.jars_dir, quick_jvm=self.quick_jvm, share_classes=False
            )
            trainer.jvm_options = options
            with trainer:
                trainer.nodes[0].stop()  # a clean exit: the JVM writes the archive

        return class_archive(
            self.jars_dir,
            "kafka",
            java=self._java(),
            classpath=self._jars(),
            flags=self._compiler_and_gc(),
            train=train,
        )

    def start(self, timeout: float = 90.0) -> Self:
        if self.share_classes and not self.jvm_options:
            self.jvm_options = archive_options(self._class_archive())
        for node in self.nodes:
            node.write_config()
        # Formatting starts a JVM per node: do it in parallel, then start all nodes together
        # (a multi-node quorum needs a majority of controllers up before any broker is ready).
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(KafkaNode.format, self.nodes))
        for node in self.nodes:
            node.launch()
        for node in self.nodes:
            node.wait_ready(timeout)
        return self

    def close(self) -> None:
        for node in self.nodes:
            node.kill()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)
