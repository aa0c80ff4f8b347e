"""The Helm chart (``deploy/kubernetes/outboxkit``), rendered with the values docs/operations.md's
install command sets (only what the chart requires) and with
``deploy/kubernetes/values-full.yaml`` (by the command its header gives): ``helm lint`` passes;
no object has a key twice (tools built on yaml.v3 refuse it); every object validates against the
Kubernetes API's schemas (kubernetes-validate, which ships them: nothing is fetched); each
worker's and Job's rendered environment loads into its own settings class (every variable real,
every value valid); its pod's termination grace period exceeds the worker's own bound on
stopping; its probes ask the paths and port outboxkit's probe server answers; the Jobs run
``migrate --check``, ``migrate`` and ``topics create`` as Helm hooks; a Secret the chart creates
is the one every pod reads; a value the workers cannot run without fails the render; and the
PrometheusRule holds the rules file, runbook links absolute.

helm is built from the Go module proxy on first use (:mod:`tests.gotools`; ``.ci/run`` builds
it first): the timeout allows that build."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from outboxkit.core.settings import ConnectionSettings, KafkaSettings, WorkerSettings
from outboxkit.core.waiting import _CANCEL_GRACE
from outboxkit.embedded._process import free_port
from outboxkit.inbox import InboxSettings
from outboxkit.probes import serve_probes
from outboxkit.relay import RelaySettings
from tests import deploy
from tests.docs_snippets import blocks
from tests.gotools import BUILD_TIMEOUT
from tests.helpers import http_client

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + 120)

#: The Kubernetes version the objects are validated against (kubernetes-validate's newest).
KUBE_VERSION = "1.37.0"
OPERATIONS = deploy.REPO / "docs" / "operations.md"


def _install_values() -> list[str]:
    """The ``--set`` arguments of docs/operations.md's ``helm install`` command (its ```sh chart
    block): the least a user must give."""
    [block] = [b for b in blocks(OPERATIONS) if b.info == "sh chart"]
    words = shlex.split(block.code.replace("\\\n", " "))
    assert words[:4] == ["helm", "install", "shop", "deploy/kubernetes/outboxkit"], words
    assert words[4:], words
    assert all(w == "--set" for w in words[4::2]), words
    return words[4:]


#: The chart's values: those the install command sets, and values-full.yaml.
VALUES = {"install": _install_values(), "full": ["-f", str(deploy.FULL_VALUES)]}
#: Custom resources of the Prometheus Operator: no schema in Kubernetes' own API.
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}


class _RefusesDuplicateKeys(yaml.SafeLoader):
    """A YAML loader that refuses a mapping with a key twice, as tools on Go's yaml.v3 do (the
    default loaders keep the last value silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(key, deep=deep) for key, _ in node.value]
        repeated = sorted({str(key) for key in keys if keys.count(key) > 1})
        if repeated:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate keys {repeated}", node.start_mark
            )
        return super().construct_mapping(node, deep=deep)


def load_objects(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.load_all(text, Loader=_RefusesDuplicateKeys) if doc]


def helm_run(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=120, check=False
    )


def render(helm: Path, values: str = "install", *extra: str) -> list[dict[str, Any]]:
    args = ["template", "shop", str(deploy.CHART), "--kube-version", KUBE_VERSION]
    result = helm_run(helm, *args, *VALUES[values], *extra)
    assert result.returncode == 0, result.stderr
    return load_objects(result.stdout)


def refused(helm: Path, *extra: str) -> str:
    """The error of a render with the install command's values and ``extra``: it must fail."""
    args = ["template", "shop", str(deploy.CHART), "--kube-version", KUBE_VERSION]
    result = helm_run(helm, *args, *VALUES["install"], *extra)
    assert result.returncode != 0, result.stdout
    return result.stderr


@pytest.fixture(scope="module", params=list(VALUES))
def rendered(request: pytest.FixtureRequest, helm: Path) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(helm, request.param)


def _deployments(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objects:
        if obj["kind"] == "Deployment":
            yield obj["metadata"]["labels"]["app.kubernetes.io/component"], obj


def _containers(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every container of the Deployments and Jobs (init containers too), by component."""
    for obj in objects:
        if obj["kind"] in {"Deployment", "Job"}:
            pod = obj["spec"]["template"]["spec"]
            for container in [*pod.get("initContainers", []), *pod["containers"]]:
                yield obj["metadata"]["labels"]["app.kubernetes.io/component"], container


def test_the_chart_lints(helm: Path) -> None:
    for values in VALUES.values():
        result = helm_run(
            helm, "lint", "--strict", str(deploy.CHART), "--kube-version", KUBE_VERSION, *values
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_documented_command_renders_with_the_helm_the_tests_build(helm: Path) -> None:
    """values-full.yaml's header command, word for word: no ``--kube-version`` (helm's own
    default must satisfy the chart's kubeVersion, as a released helm's does)."""
    [command] = [
        line.removeprefix("#").strip()
        for line in deploy.FULL_VALUES.read_text().splitlines()
        if line.startswith("#   helm template")
    ]
    words = shlex.split(command)
    assert words[0] == "helm"
    result = subprocess.run(
        [str(helm), *words[1:]],
        cwd=deploy.REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert load_objects(result.stdout)


def test_no_object_has_a_key_twice(helm: Path) -> None:
    """Labels, env and annotations merged from several places (the chart's, a worker's, the
    user's) must be one mapping each; every render of this module goes through the same
    loader, this one renders the most merging: every extra label the values allow."""
    objects = render(
        helm,
        "full",
        "--set", "podLabels.app\\.kubernetes\\.io/name=mine",
        "--set", "prometheusRule.labels.release=other",
    )  # fmt: skip
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "outboxkit", obj["metadata"]["name"]


def test_every_object_validates_against_the_kubernetes_api(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    name, objects = rendered
    kinds = sorted(obj["kind"] for obj in objects)
    expected = {
        "install": ["Deployment", "Job", "PodDisruptionBudget", "Service", "ServiceAccount"],
        "full": [
            *["Deployment"] * 3,
            *["Job"] * 2,  # migrate, create-topics
            *["PodDisruptionBudget"] * 2,  # the shipping inbox opts out
            "PrometheusRule",
            *["Service"] * 3,
            "ServiceAccount",
            "ServiceMonitor",
        ],
    }
    assert kinds == expected[name]
    for obj in objects:
        if obj["kind"] in OPERATOR_KINDS:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        # strict: a field the API does not know is an error, as kubectl's server side is.
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_each_workers_environment_loads_into_its_settings(
    rendered: tuple[str, list[dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, objects = rendered
    pem = tmp_path / "file.pem"
    pem.write_text("mounted from a Secret\n")
    settings_classes: dict[str, type[KafkaSettings | ConnectionSettings]] = {
        "relay": RelaySettings,
        "inbox": InboxSettings,
        "migrate": ConnectionSettings,
        "create-topics": KafkaSettings,
    }
    for component, container in _containers(objects):
        values = {var["name"]: var.get("value") for var in container["env"]}
        # The Secret as its operator fills it: the SASL login only for a SASL protocol (the
        # chart reads those keys as optional), no key password (the key is not encrypted).
        sasl = (values.get("OUTBOXKIT_KAFKA_SECURITY_PROTOCOL") or "").startswith("SASL_")
        secrets = {
            "OUTBOXKIT_DATABASE_URL": "postgresql://relay:secret@db:5432/shop",
            "OUTBOXKIT_KAFKA_SASL_USERNAME": "orders" if sasl else None,
            "OUTBOXKIT_KAFKA_SASL_PASSWORD": "secret" if sasl else None,
        }
        env: dict[str, str] = {}
        for var in container["env"]:
            if not var["name"].startswith("OUTBOXKIT_"):
                continue
            value = var.get("value", secrets.get(var["name"]))
            if value is not None and value.startswith("/etc/outboxkit/"):
                value = str(pem)  # a file the pod mounts: any existing file will do here
            if value is not None:
                env[var["name"]] = value
        with monkeypatch.context() as patch:
            for name in [n for n in os.environ if n.startswith("OUTBOXKIT_")]:
                patch.delenv(name)
            for name, value in env.items():
                patch.setenv(name, value)
            settings_class = settings_classes[component]
            settings_class()  # raises on an invalid value
        cli_only = {"OUTBOXKIT_HTTP_PORT", "OUTBOXKIT_LOG_FORMAT", "OUTBOXKIT_LOG_LEVEL"}
        # Settings the shared `config` gives every container, which a Job's command ignores.
        shared = {f"OUTBOXKIT_{name.upper()}" for name in WorkerSettings.model_fields}
        fields = {f"OUTBOXKIT_{name.upper()}" for name in settings_class.model_fields}
        unknown = set(env) - fields - cli_only
        if component in {"relay", "inbox"}:
            assert unknown == set(), component
        else:
            assert unknown <= shared, component
        assert container["command"] == ["outboxkit"]
        assert container["args"][0] == component.removeprefix("create-") or (
            component == "create-topics" and container["args"][0] == "topics"
        )


def _bound(component: str, env: dict[str, str]) -> float:
    """A worker's own bound on stopping, from its settings' defaults and ``env``."""
    session = float(env.get("OUTBOXKIT_SESSION_TIMEOUT", _default(WorkerSettings, "session")))
    if component == "relay":
        revoke = float(env.get("OUTBOXKIT_REVOKE_TIMEOUT", _default(RelaySettings, "revoke")))
        # Side tasks cancelled, the blocks drained and cancelled, then leaving the group.
        return _CANCEL_GRACE + revoke + _CANCEL_GRACE + revoke + session
    return 2 * session  # commit and leave the group (inbox/worker.py)


def _default(cls: type[WorkerSettings], prefix: str) -> float:
    default = cls.model_fields[f"{prefix}_timeout"].default
    assert isinstance(default, float)
    return default


def test_a_stopping_worker_has_its_grace_period(
    rendered: tuple[str, list[dict[str, Any]]], helm: Path
) -> None:
    _, objects = rendered
    for component, deployment in _deployments(objects):
        pod = deployment["spec"]["template"]["spec"]
        [container] = pod["containers"]
        env = {var["name"]: var["value"] for var in container["env"] if "value" in var}
        bound = _bound(component, env)
        assert pod["terminationGracePeriodSeconds"] > bound, (component, bound)
    error = refused(helm, "--set", "relay.terminationGracePeriodSeconds=30")
    assert "must be above the worker's own stop bound, 60 s" in error


async def test_the_probes_ask_what_a_worker_serves(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, objects = rendered
    port = free_port()
    server = await serve_probes(port, lambda: (True, {"running": True}), host="127.0.0.1")
    try:
        async with http_client(base_url=f"http://127.0.0.1:{port}") as http:
            for component, deployment in _deployments(objects):
                [container] = deployment["spec"]["template"]["spec"]["containers"]
                env = {var["name"]: var.get("value") for var in container["env"]}
                [http_port] = container["ports"]
                assert http_port["name"] == "http"
                assert int(env["OUTBOXKIT_HTTP_PORT"]) == http_port["containerPort"]
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    get = container[probe]["httpGet"]
                    assert get["port"] == "http", (component, probe)
                    response = await http.get(get["path"])
                    assert response.status_code == 200, (component, probe, get["path"])
                readiness = container["readinessProbe"]["httpGet"]["path"]
                assert readiness == "/healthz", component
                # /healthz is 503 through a database or broker outage, which a restart does
                # not end: a liveness probe on it would crash-loop every worker through one.
                liveness = container["livenessProbe"]["httpGet"]["path"]
                assert liveness == "/metrics", component
    finally:
        server.close()
        with contextlib.suppress(asyncio.CancelledError):
            await server.wait_closed()


def test_the_prometheus_rule_holds_the_rules_file(helm: Path) -> None:
    objects = render(helm, "full")
    [rule] = [obj for obj in objects if obj["kind"] == "PrometheusRule"]
    groups = deploy.rules()["groups"]
    base = yaml.safe_load(deploy.FULL_VALUES.read_text())["prometheusRule"]["runbookBaseUrl"]
    for group in groups:
        for entry in group["rules"]:
            if "alert" in entry:
                url = entry["annotations"]["runbook_url"]
                assert not re.match(r"https?://", url)  # relative in the rules file
                entry["annotations"]["runbook_url"] = base + url
    assert rule["spec"]["groups"] == groups
    assert rule["metadata"]["labels"]["release"] == "monitoring"
    assert rule["metadata"]["labels"]["team"] == "orders"


def test_the_operators_prometheus_finds_the_rules_and_monitor_by_default(helm: Path) -> None:
    """kube-prometheus-stack's Prometheus loads only objects labelled ``release: <its Helm
    release>``: the chart sets the usual name by default, and every runbook link is absolute
    (a relative one leads nowhere from a pager), without a slash doubled or missing."""
    objects = render(
        helm,
        "install",
        "--set", "prometheusRule.enabled=true",
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "prometheusRule.runbookBaseUrl=https://git.example.com/outboxkit/blob/v0.1.0",
    )  # fmt: skip
    operator = [obj for obj in objects if obj["kind"] in OPERATOR_KINDS]
    assert len(operator) == 2
    for obj in operator:
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack", obj["kind"]
    [rule] = [obj for obj in objects if obj["kind"] == "PrometheusRule"]
    urls = [
        entry["annotations"]["runbook_url"]
        for group in rule["spec"]["groups"]
        for entry in group["rules"]
        if "alert" in entry
    ]
    assert urls
    for url in urls:
        assert url.startswith("https://git.example.com/outboxkit/blob/v0.1.0/docs/"), url
    error = refused(helm, "--set", "prometheusRule.enabled=true")
    assert "prometheusRule.runbookBaseUrl: the absolute URL" in error


def test_a_secret_the_chart_creates_is_the_one_every_pod_reads(helm: Path) -> None:
    """``secrets.create`` with ``secrets.values``, as values.yaml offers it: the Secret is
    rendered, every container (workers and Jobs) reads that one, and it is made before the
    Jobs that read it (a hook of a lower weight: hooks run before the release's objects)."""
    url = "postgresql://relay:secret@db:5432/shop"
    objects = render(
        helm,
        "install",
        "--set", "secrets.create=true",
        "--set", f"secrets.values.database-url={url}",
        "--set", "inboxes[0].name=billing,inboxes[0].app=shop.billing:inbox",
        "--set", "inboxes[0].env.OUTBOXKIT_TOPICS=orders",
    )  # fmt: skip
    [secret] = [obj for obj in objects if obj["kind"] == "Secret"]
    kubernetes_validate.validate(secret, KUBE_VERSION, strict=True)
    assert secret["stringData"] == {"database-url": url}
    name = secret["metadata"]["name"]
    read = {
        (component, ref["secretKeyRef"]["name"])
        for component, container in _containers(objects)
        for var in container["env"]
        if (ref := var.get("valueFrom")) and "secretKeyRef" in ref
    }
    assert {component for component, _ in read} == {"relay", "inbox", "migrate"}
    assert {secret_name for _, secret_name in read} == {name}
    jobs = [obj for obj in objects if obj["kind"] == "Job"]
    secret_weight = int(secret["metadata"]["annotations"]["helm.sh/hook-weight"])
    for job in jobs:
        hook = job["metadata"]["annotations"]
        assert secret["metadata"]["annotations"]["helm.sh/hook"] == hook["helm.sh/hook"]
        assert secret_weight < int(hook["helm.sh/hook-weight"])
    # A key some worker reads, missing from the values: refused, naming the key and who reads it.
    error = refused(helm, "--set", "secrets.create=true", "--set", "secrets.values.other=x")
    assert "secrets.values has no database-url, which relay reads (its databaseUrlKey)" in error


def test_the_jobs_migrate_and_create_topics_before_the_workers_start(helm: Path) -> None:
    """docs/upgrading.md's steps 1 and 2 as Helm hooks: ``migrate --check`` (an init container:
    a failed check stops the Job before ``migrate``), then ``migrate``, on every install and
    upgrade; then ``topics create`` for every topic the workers use, dead-letter topics too."""
    objects = render(helm, "full")
    jobs = {
        obj["metadata"]["labels"]["app.kubernetes.io/component"]: obj
        for obj in objects
        if obj["kind"] == "Job"
    }
    assert set(jobs) == {"migrate", "create-topics"}
    weights = {}
    for component, job in jobs.items():
        hook = job["metadata"]["annotations"]
        assert hook["helm.sh/hook"] == "pre-install,pre-upgrade", component
        weights[component] = int(hook["helm.sh/hook-weight"])
        pod = job["spec"]["template"]["spec"]
        assert pod["restartPolicy"] == "Never"
        # Not the ServiceAccount the chart creates: it does not exist yet when a hook runs.
        assert pod["serviceAccountName"] == "shop-deploy"
    assert weights["migrate"] < weights["create-topics"]
    migrate = jobs["migrate"]["spec"]["template"]["spec"]
    [check] = migrate["initContainers"]
    [run] = migrate["containers"]
    assert (check["args"], run["args"]) == (["migrate", "--check"], ["migrate"])
    for container in (check, run):
        [url] = [var for var in container["env"] if var["name"] == "OUTBOXKIT_DATABASE_URL"]
        assert url["valueFrom"]["secretKeyRef"]["key"] == "owner-database-url"
    [topics] = jobs["create-topics"]["spec"]["template"]["spec"]["containers"]
    assert topics["args"] == [
        "topics", "create", "--partitions", "12", "--replication-factor", "3",
        "--config", "min.insync.replicas=2", "--config", "retention.ms=604800000",
        "--dlq", "--", "orders", "payments",
    ]  # fmt: skip
    assert "OUTBOXKIT_DATABASE_URL" not in {var["name"] for var in topics["env"]}
    # The defaults: migrate on, with its check; no topics Job; the namespace's ServiceAccount.
    defaults = [obj for obj in render(helm) if obj["kind"] == "Job"]
    [job] = defaults
    assert job["metadata"]["labels"]["app.kubernetes.io/component"] == "migrate"
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "default"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param(
            ["--set", "relay.env=null"],
            "relay: set OUTBOXKIT_TOPICS (the topics its events go to",
            id="relay-without-topics",
        ),
        pytest.param(
            ["--set", "inboxes[0].name=billing,inboxes[0].app=shop.billing:inbox"],
            "inboxes[billing]: set OUTBOXKIT_TOPICS (the topics it consumes)",
            id="inbox-without-topics",
        ),
        pytest.param(
            ["--set", "image.tag="],
            "image.tag: the tag of your service's image",
            id="image-without-tag",
        ),
    ],
)
def test_what_a_worker_cannot_run_without_fails_the_render(
    helm: Path, values: list[str], message: str
) -> None:
    """Rather than render, deploy, and crash-loop (an inbox without topics exits 2) or run an
    image nobody built (outboxkit's version as the tag of the user's image)."""
    assert message in refused(helm, *values)


def test_the_relays_may_be_stopped_before_new_ones_start(helm: Path) -> None:
    """``relay.strategy.type=Recreate``: for a release whose relays cannot share a group with
    the old ones (docs/upgrading.md)."""
    objects = render(helm, "install", "--set", "relay.strategy.type=Recreate")
    [relay] = [
        deployment for component, deployment in _deployments(objects) if component == "relay"
    ]
    assert relay["spec"]["strategy"] == {"type": "Recreate"}
    kubernetes_validate.validate(relay, KUBE_VERSION, strict=True)
