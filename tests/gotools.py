"""Go programs the tests run, built from the Go module proxy with ``go install`` and cached in
``~/.cache/outboxkit``: Toxiproxy's server (the network-fault tests), promtool (the alert
rules' unit tests) and helm (the Kubernetes chart).

None is a dependency of outboxkit: a service's own tests never need Go. A missing binary is
built on first use (never a skip: a build that fails fails the test), under a lock file, so a
test that needs a tool while another process builds it — ``.ci/run``'s background build, the
other pytest-xdist worker — waits for that build instead of starting a second one.

``python3 -m tests.gotools build [NAME ...]`` builds the named tools (all of them by default)
if they are not cached, one after the other, and prints their paths: ``.ci/run`` runs it in
the background first thing, with the system's Python (this module needs nothing else), while
it installs the rest. The fixtures ``promtool`` and ``helm`` (tests/conftest.py) give a
binary's path.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CACHE = Path.home() / ".cache" / "outboxkit"

#: Seconds a build may take (a cold promtool build downloads ~1.8 GB of modules).
BUILD_TIMEOUT = 1500


class GoBuildError(RuntimeError):
    """A tool is not cached and could not be built."""


@dataclass(frozen=True)
class GoTool:
    """One ``go install``-able command, at a fixed version."""

    name: str
    #: The package path of the command (``go install <package>@<version>``).
    package: str
    version: str
    #: Linker flags, e.g. the version string the binary prints.
    ldflags: str = ""
    #: Build tags (``go install -tags``).
    tags: str = ""
    #: What sets this build apart from an earlier one of the same version (its flags), in the
    #: cached binary's name: a cache from before a change of flags is not taken for this build.
    variant: str = ""

    @property
    def cached(self) -> Path:
        return CACHE / "-".join(part for part in (self.name, self.version, self.variant) if part)

    def path(self) -> Path:
        """The cached binary, built first if it is missing."""
        if os.access(self.cached, os.X_OK):
            return self.cached
        with self._lock():
            if not os.access(self.cached, os.X_OK):  # nobody built it while this waited
                self._build()
        return self.cached

    @contextmanager
    def _lock(self) -> Iterator[None]:
        CACHE.mkdir(parents=True, exist_ok=True)
        with (CACHE / f".{self.name}-{self.version}.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _build(self) -> None:
        go = shutil.which("go") or "/usr/local/go/bin/go"
        if not Path(go).exists():
            raise GoBuildError(
                f"{self.name} is not in {self.cached} and there is no Go to build it with: "
                "install Go (https://go.dev/doc/install) or run .ci/run"
            )
        command = [go, "install"]
        if self.ldflags:
            command.append(f"-ldflags={self.ldflags}")
        if self.tags:
            command.append(f"-tags={self.tags}")
        command.append(f"{self.package}@{self.version}")
        with tempfile.TemporaryDirectory(prefix=f"{self.name}-build-", dir=CACHE) as gobin:
            started = time.monotonic()
            result = subprocess.run(
                command,
                env={**os.environ, "GOBIN": gobin, "CGO_ENABLED": "0"},
                capture_output=True,
                text=True,
                check=False,
                timeout=BUILD_TIMEOUT,
            )
            if result.returncode != 0:
                raise GoBuildError(
                    f"building {self.name} {self.version} failed:\n{result.stdout}{result.stderr}"
                )
            # Atomic: whoever looks without the lock sees no binary or a whole one.
            os.replace(Path(gobin) / self.package.rsplit("/", 1)[1], self.cached)
            print(f"built {self.cached} in {time.monotonic() - started:.0f} s", file=sys.stderr)


TOXIPROXY = GoTool("toxiproxy-server", "github.com/Shopify/toxiproxy/v2/cmd/server", "v2.5.0")
#: Prometheus 3.x's promtool (the Go module's versions are v0.<major><minor>.<patch>), without
#: the service discoveries (``remove_all_sd``: the cloud SDKs they pull in are most of a full
#: build, and the tests only check and test rules).
PROMTOOL = GoTool(
    "promtool",
    "github.com/prometheus/prometheus/cmd/promtool",
    "v0.316.0",
    ldflags="-X github.com/prometheus/common/version.Version=3.16.0",
    tags="remove_all_sd",
)
#: The Kubernetes version helm assumes without ``--kube-version`` (``helm template``): its
#: release builds set it from the client-go module they build with (helm's Makefile), while a
#: plain ``go install`` leaves 1.20, which the chart's ``kubeVersion: >=1.25.0-0`` refuses.
#: helm v3.22.0 builds with client-go v0.37.0, hence 1.37, as a helm from get.helm.sh says.
HELM_KUBE_VERSION = ("1", "37")
HELM = GoTool(
    "helm",
    "helm.sh/helm/v3/cmd/helm",
    "v3.22.0",
    ldflags=" ".join(
        [
            "-X helm.sh/helm/v3/internal/version.version=v3.22.0",
            *(
                f"-X helm.sh/helm/v3/pkg/{package}.k8sVersion{part}={value}"
                for package in ("chartutil", "lint/rules")
                for part, value in zip(("Major", "Minor"), HELM_KUBE_VERSION, strict=True)
            ),
        ]
    ),
    variant="k8s1.37",
)
TOOLS = {tool.name: tool for tool in (TOXIPROXY, PROMTOOL, HELM)}


if __name__ == "__main__":
    if sys.argv[1:2] != ["build"] or not set(sys.argv[2:]) <= set(TOOLS):
        sys.exit(f"usage: python -m tests.gotools build [{' | '.join(TOOLS)} ...]")
    for name in sys.argv[2:] or TOOLS:
        print(TOOLS[name].path(), flush=True)
