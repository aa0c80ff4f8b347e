"""The Helm chart (``deploy/kubernetes/outboxkit``), rendered with its defaults and with
``deploy/kubernetes/values-full.yaml``: ``helm lint`` passes; every object validates against the
Kubernetes API's schemas (kubernetes-validate, which ships them: nothing is fetched); each
worker's rendered environment loads into its own settings class (every variable real, every
value valid); its pod's termination grace period exceeds the worker's own bound on stopping;
its probes ask the paths and port outboxkit's probe server answers; and the PrometheusRule
holds the rules file, runbook links prefixed.

helm is built from the Go module proxy on first use (:mod:`tests.gotools`; ``.ci/run`` builds
it first): the timeout allows that build."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from outboxkit.core.settings import WorkerSettings
from outboxkit.core.supervisor import _CANCEL_GRACE
from outboxkit.embedded._process import free_port
from outboxkit.inbox import InboxSettings
from outboxkit.probes import serve_probes
from outboxkit.relay import RelaySettings
from tests import deploy
from tests.gotools import BUILD_TIMEOUT
from tests.helpers import http_client

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT + 120)

#: The Kubernetes version the objects are validated against (kubernetes-validate's newest).
KUBE_VERSION = "1.37.0"
VALUES = {"defaults": None, "full": deploy.FULL_VALUES}
#: Custom resources of the Prometheus Operator: no schema in Kubernetes' own API.
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}


def helm_run(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=120, check=False
    )


def render(helm: Path, values: Path | None, *extra: str) -> list[dict[str, Any]]:
    args = ["template", "shop", str(deploy.CHART), "--kube-version", KUBE_VERSION, *extra]
    if values is not None:
        args += ["-f", str(values)]
    result = helm_run(helm, *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module", params=list(VALUES))
def rendered(request: pytest.FixtureRequest, helm: Path) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(helm, VALUES[request.param])


def _deployments(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objects:
        if obj["kind"] == "Deployment":
            yield obj["metadata"]["labels"]["app.kubernetes.io/component"], obj


def test_the_chart_lints(helm: Path) -> None:
    for values in VALUES.values():
        extra = ["-f", str(values)] if values else []
        result = helm_run(
            helm, "lint", "--strict", str(deploy.CHART), "--kube-version", KUBE_VERSION, *extra
        )
        assert result.returncode == 0, result.stdout + result.stderr


def test_every_object_validates_against_the_kubernetes_api(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    name, objects = rendered
    kinds = sorted(obj["kind"] for obj in objects)
    expected = {
        "defaults": ["Deployment", "PodDisruptionBudget", "Service", "ServiceAccount"],
        "full": [
            *["Deployment"] * 3,
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
    for component, deployment in _deployments(objects):
        [container] = deployment["spec"]["template"]["spec"]["containers"]
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
            settings_class = RelaySettings if component == "relay" else InboxSettings
            settings_class()  # raises on an invalid value
        cli_only = {"OUTBOXKIT_HTTP_PORT", "OUTBOXKIT_LOG_FORMAT", "OUTBOXKIT_LOG_LEVEL"}
        fields = {f"OUTBOXKIT_{name.upper()}" for name in settings_class.model_fields}
        assert set(env) - fields - cli_only == set(), component
        assert container["command"] == ["outboxkit"]
        assert container["args"][0] == component


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
    refused = helm_run(
        helm, "template", "shop", str(deploy.CHART), "--kube-version", KUBE_VERSION,
        "--set", "relay.terminationGracePeriodSeconds=30",
    )  # fmt: skip
    assert refused.returncode != 0
    assert "must be above the worker's own stop bound, 60 s" in refused.stderr


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
    objects = render(helm, deploy.FULL_VALUES)
    [rule] = [obj for obj in objects if obj["kind"] == "PrometheusRule"]
    groups = deploy.rules()["groups"]
    base = yaml.safe_load(deploy.FULL_VALUES.read_text())["prometheusRule"]["runbookBaseUrl"]
    for group in groups:
        for entry in group["rules"]:
            if "alert" in entry:
                url = entry["annotations"]["runbook_url"]
                entry["annotations"]["runbook_url"] = base + url
    assert rule["spec"]["groups"] == groups


def test_the_relays_may_be_stopped_before_new_ones_start(helm: Path) -> None:
    """``relay.strategy.type=Recreate``: for a release whose relays cannot share a group with
    the old ones (docs/upgrading.md)."""
    objects = render(helm, None, "--set", "relay.strategy.type=Recreate")
    [relay] = [
        deployment for component, deployment in _deployments(objects) if component == "relay"
    ]
    assert relay["spec"]["strategy"] == {"type": "Recreate"}
    kubernetes_validate.validate(relay, KUBE_VERSION, strict=True)
