"""Rendering the chart with real helm, and walking what it renders."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).parents[2]
CHART = ROOT / "helm" / "spotrain"
GKE_EXAMPLE = CHART / "examples" / "gke-values.yaml"
TOOLS_BIN = ROOT / ".tools" / "bin"
INSTALL_HELM = ROOT / "tools" / "install-helm"
RELEASE = "spotrain"
NAMESPACE = "spotrain"

# What a minimal install must give: values.yaml has no defaults for these.
REQUIRED_SETS = {
    "gcp.project": "acme-ml",
    "gke.location": "us-central1",
    "gke.cluster": "training",
    "checkpoints.root": "gs://acme-ml-spotrain/checkpoints",
}

Manifest = dict[str, Any]


class HelmUnavailableError(RuntimeError):
    """Neither .tools/bin nor PATH has helm, and installing it failed."""


def find_helm(*, install: bool = True) -> Path:
    """helm from .tools/bin (where `make test` installs it) or PATH; else try to install it."""
    for candidate in (TOOLS_BIN / "helm", shutil.which("helm")):
        if candidate is not None and os.access(candidate, os.X_OK):
            return Path(candidate)
    if install and INSTALL_HELM.exists():
        result = subprocess.run(
            [str(INSTALL_HELM), str(TOOLS_BIN)],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        if result.returncode == 0:
            return find_helm(install=False)
        detail = (result.stdout + result.stderr).strip().splitlines()[-3:]
        msg = f"{INSTALL_HELM} failed: {' / '.join(detail)}"
        raise HelmUnavailableError(msg)
    msg = f"no helm in {TOOLS_BIN} or on PATH, and no {INSTALL_HELM} to install it"
    raise HelmUnavailableError(msg)


@dataclass(frozen=True)
class Helm:
    binary: Path

    def run(self, *args: str, chart: Path = CHART) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.binary), *args, str(chart)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
            # helm keeps caches and config under HOME/XDG; none of it matters offline.
            env={**os.environ, "HELM_CACHE_HOME": str(ROOT / ".tools" / "helm-cache")},
        )

    def template(
        self,
        *,
        values: Sequence[Path] = (),
        sets: Mapping[str, str] = REQUIRED_SETS,
        extra: Sequence[str] = (),
        chart: Path = CHART,
    ) -> subprocess.CompletedProcess[str]:
        args = ["template", RELEASE, "--namespace", NAMESPACE]
        for path in values:
            args += ["--values", str(path)]
        for key, value in sets.items():
            args += ["--set", f"{key}={value}"]
        return self.run(*args, *extra, chart=chart)

    def render(
        self,
        *,
        values: Sequence[Path] = (),
        sets: Mapping[str, str] = REQUIRED_SETS,
        extra: Sequence[str] = (),
        chart: Path = CHART,
    ) -> list[Manifest]:
        result = self.template(values=values, sets=sets, extra=extra, chart=chart)
        assert result.returncode == 0, result.stderr
        return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def kinds(manifests: Sequence[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def named(manifests: Sequence[Manifest], kind: str, name: str) -> Manifest:
    found = [m for m in kinds(manifests, kind) if m["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


@dataclass(frozen=True)
class Pod:
    """A pod spec somewhere in the rendered chart, and where it is."""

    where: str
    spec: dict[str, Any]
    metadata: dict[str, Any]

    def containers(self) -> list[dict[str, Any]]:
        return [*self.spec.get("initContainers", []), *self.spec["containers"]]


def pods(manifests: Sequence[Manifest]) -> Iterator[Pod]:
    """Every pod template: workloads, the hook Job, and the RayCluster's head and workers."""
    for m in manifests:
        where = f"{m['kind']}/{m['metadata']['name']}"
        if m["kind"] in {"Deployment", "DaemonSet", "StatefulSet", "Job"}:
            template = m["spec"]["template"]
            yield Pod(where, template["spec"], template.get("metadata", {}))
        elif m["kind"] == "RayCluster":
            head = m["spec"]["headGroupSpec"]["template"]
            yield Pod(f"{where}/head", head["spec"], head.get("metadata", {}))
            for group in m["spec"].get("workerGroupSpecs", []):
                template = group["template"]
                yield Pod(
                    f"{where}/{group['groupName']}", template["spec"], template.get("metadata", {})
                )


def env_of(container: Mapping[str, Any]) -> dict[str, Any]:
    """name → value, or the valueFrom mapping where the value comes from elsewhere."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}
