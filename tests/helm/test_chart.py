"""The Helm chart, rendered by real helm: lint, schemas, and what a careful reviewer checks."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # the package ships no type hints
import pytest
import yaml
from jsonschema import Draft202012Validator
from pydantic import AliasChoices, ValidationError
from pydantic_settings import BaseSettings
from referencing import Registry, Resource

from services.checkpointer.settings import CheckpointerSettings
from services.preemption_watcher.metadata_agent import MetadataAgentSettings
from services.preemption_watcher.settings import PreemptionWatcherSettings
from services.scaler.settings import ScalerSettings
from services.submitter.settings import SubmitterSettings
from shared.events.types import CapacityClass
from shared.messaging import BusSettings
from shared.policy.teams import parse_teams
from shared.resources import (
    NODE_LABEL,
    POOL_LABEL,
    RESOURCE_PER_NODE,
    capacity_resource,
    pool_resource,
)
from shared.ui.run import UiSettings
from tests.fakes.kuberay_server import FakeKubeRay, serve_fake_kuberay
from tests.fakes.kuberay_validation import ray_cluster_errors
from tests.helm.chart import (
    CHART,
    GKE_EXAMPLE,
    NAMESPACE,
    RELEASE,
    REQUIRED_SETS,
    Helm,
    Manifest,
    env_of,
    kinds,
    named,
    pods,
)

pytestmark = pytest.mark.helm

# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.29", ".".join(kubernetes_validate.latest_version().split(".")[:2]))
RAYCLUSTER_SCHEMA = Path(__file__).parent / "schemas" / "raycluster-ray.io-v1.schema.json"
# Custom resources with no schema available offline: checked field by field below.
NO_SCHEMA = {"PodMonitor", "PodMonitoring"}

# Which settings each process reads, found by its command.
SETTINGS_BY_MODULE: dict[str, type[BaseSettings]] = {
    "services.submitter": SubmitterSettings,
    "services.scaler": ScalerSettings,
    "services.preemption_watcher": PreemptionWatcherSettings,
    "services.checkpointer": CheckpointerSettings,
    "services.preemption_watcher.metadata_agent": MetadataAgentSettings,
    "shared.ui": UiSettings,
}
SERVICE_ACCOUNTS = {
    "submitter": "spotrain-submitter",
    "scaler": "spotrain-scaler",
    "preemption-watcher": "spotrain-preemption-watcher",
    "checkpointer": "spotrain-checkpointer",
}
WORKLOAD_IDENTITY = "iam.gke.io/gcp-service-account"


def _values(path: Path = CHART / "values.yaml") -> dict[str, Any]:
    import yaml  # noqa: PLC0415

    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded


def _module(container: dict[str, Any]) -> str | None:
    """`services.x` of `python -m services.x`, None for anything else."""
    command = [*container.get("command", []), *container.get("args", [])]
    if command[:2] == ["python", "-m"]:
        return str(command[2])
    return None


def _processes(manifests: Sequence[Manifest]) -> list[tuple[str, dict[str, Any]]]:
    """Every spotrain process (not Ray's): the services, the agents and the hook."""
    found = []
    for pod in pods(manifests):
        if pod.where.startswith("RayCluster/"):
            continue
        found += [(f"{pod.where}/{c['name']}", c) for c in pod.spec["containers"]]
    return found


def _env_names(settings: type[BaseSettings]) -> set[str]:
    """The environment variables a settings class reads: its prefix and fields, or aliases."""
    prefix = str(settings.model_config.get("env_prefix", ""))
    names = set()
    for name, field in settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names |= {str(choice).upper() for choice in alias.choices}
        else:
            names.add(f"{prefix}{name}".upper())
    return names


# -- helm itself ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([f"--set={k}={v}" for k, v in REQUIRED_SETS.items()], id="minimal"),
        pytest.param(["--values", str(GKE_EXAMPLE)], id="gke-example"),
    ],
)
def test_helm_lint_passes(helm: Helm, args: list[str]) -> None:
    """`helm lint --strict` finds nothing to complain of (an icon is only a suggestion)."""
    result = helm.run("lint", "--strict", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_defaults_alone_fail_naming_every_required_value(helm: Helm) -> None:
    """An install without the cluster and bucket stops at once, saying all that is missing."""
    result = helm.template(sets={})
    assert result.returncode != 0
    for value in REQUIRED_SETS:
        assert f"{value} is required" in result.stderr


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        pytest.param(
            {"scaler.settings.provider": "local"},
            "at '/scaler/settings/provider': value must be one of 'gke', 'kuberay'",
            id="unknown-provider",
        ),
        pytest.param(
            {"bus.nats_ulr": "nats://x:4222"},
            "at '/bus': additional properties 'nats_ulr' not allowed",
            id="misspelt-setting",
        ),
        pytest.param(
            {"preemptionWatcher.settings.sources": "{local}"},
            "at '/preemptionWatcher/settings/sources/0': value must be one of",
            id="local-source-on-kubernetes",
        ),
        pytest.param(
            {"checkpoints.root": "s3://bucket/checkpoints"},
            "at '/checkpoints/root': 's3://bucket/checkpoints' does not match pattern",
            id="checkpoints-not-on-gcs",
        ),
        pytest.param(
            {"containerSecurityContext.readOnlyRootFilesystem": "false"},
            "at '/containerSecurityContext/readOnlyRootFilesystem': value must be true",
            id="writable-root-filesystem",
        ),
        pytest.param(
            {"podSecurityContext.runAsNonRoot": "false"},
            "at '/podSecurityContext/runAsNonRoot': value must be true",
            id="root-allowed",
        ),
        pytest.param(
            {"httpPort": "80"}, "at '/httpPort': minimum: got 80, want 1,024", id="privileged-port"
        ),
        pytest.param(
            {"scaler.settings.budget_per_hour_usd": "-5"},
            "at '/scaler/settings/budget_per_hour_usd': minimum: got -5, want 0",
            id="negative-budget",
        ),
        pytest.param(
            {"pools[0].name": "GPU_Spot", "pools[0].capacity": "cheap"},
            "at '/pools/0/capacity': value must be one of 'spot', 'on-demand'",
            id="bad-pool",
        ),
    ],
)
def test_values_schema_rejects_a_wrong_value_with_a_clear_message(
    helm: Helm, sets: dict[str, str], message: str
) -> None:
    """values.schema.json stops `helm template`/`install` and names the value and the rule."""
    result = helm.template(sets={**REQUIRED_SETS, **sets})
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


def test_gce_pubsub_source_without_subscription_fails(helm: Helm) -> None:
    """The chart asks at install time for what the watcher's settings would refuse at start."""
    result = helm.template(
        sets={**REQUIRED_SETS, "preemptionWatcher.settings.sources": "{gce-pubsub,k8s}"}
    )
    assert result.returncode != 0
    assert "preemptionWatcher.settings.pubsub_subscription is required" in result.stderr


def test_schema_offers_only_fields_the_settings_classes_have() -> None:
    """Each `settings` key the schema allows is a field of that service's settings class."""
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]
    classes: dict[str, type[BaseSettings]] = {
        "submitter": SubmitterSettings,
        "scaler": ScalerSettings,
        "preemptionWatcher": PreemptionWatcherSettings,
        "checkpointer": CheckpointerSettings,
        "metadataAgent": MetadataAgentSettings,
    }
    for key, settings in classes.items():
        offered = set(schema[key]["properties"]["settings"]["properties"])
        assert offered <= set(settings.model_fields), (key, offered - set(settings.model_fields))
    assert set(schema["bus"]["properties"]) <= set(BusSettings.model_fields)


# -- every object is valid Kubernetes ------------------------------------------------------


@cache
def _definitions(version: str) -> tuple[Traversable, Registry[Any]]:
    """kubernetes-validate's strict schemas of one version, parsed once per test run."""
    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    (strict,) = [f for f in folder.iterdir() if f.name == f"v{version}.0-local-strict"]
    definitions = json.loads(strict.joinpath("_definitions.json").read_text())
    registry: Registry[Any] = Registry().with_resource(
        definitions["$id"], Resource.from_contents(definitions)
    )
    return strict, registry


@cache
def _kubernetes_validator(kind: str, api_version: str, version: str) -> Draft202012Validator:
    """The validator kubernetes_validate.validate builds (same files, same draft), cached:
    the package parses its megabyte of definitions again on every call."""
    strict, registry = _definitions(version)
    # rbac.authorization.k8s.io/v1 -> rbac-v1, as kubernetes-validate names its files.
    group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema = json.loads(strict.joinpath(f"{kind.lower()}-{group}.json").read_text())
    resource = Resource.from_contents(schema)
    return Draft202012Validator(schema, registry=registry.with_resource(schema["$id"], resource))


@cache
def _raycluster_validator(version: str) -> Draft202012Validator:
    _, registry = _definitions(version)
    schema = json.loads(RAYCLUSTER_SCHEMA.read_text())
    resource = Resource.from_contents(schema)
    return Draft202012Validator(schema, registry=registry.with_resource(schema["$id"], resource))


def _errors(validator: Draft202012Validator, manifest: Manifest) -> list[str]:
    return [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(manifest)]


@pytest.mark.parametrize("render", ["minimal", "gke", "kuberay", "with_ui"])
def test_every_object_matches_the_kubernetes_schemas(
    render: str, request: pytest.FixtureRequest
) -> None:
    """Strict schemas (unknown fields are errors) of the oldest and newest supported version."""
    manifests: list[Manifest] = request.getfixturevalue(render)
    for manifest in manifests:
        if manifest["kind"] == "RayCluster" or manifest["kind"] in NO_SCHEMA:
            continue
        name = f"{manifest['kind']}/{manifest['metadata']['name']}"
        for version in KUBERNETES_VERSIONS:
            validator = _kubernetes_validator(manifest["kind"], manifest["apiVersion"], version)
            assert not _errors(validator, manifest), (name, version, _errors(validator, manifest))
    assert "Deployment" in {m["kind"] for m in manifests}


def test_cached_validation_answers_as_kubernetes_validate_does(minimal: list[Manifest]) -> None:
    """The cache above agrees with kubernetes_validate.validate, on a good object and a bad."""
    deployment = copy.deepcopy(kinds(minimal, "Deployment")[0])
    version = KUBERNETES_VERSIONS[0]
    validator = _kubernetes_validator("Deployment", "apps/v1", version)
    kubernetes_validate.validate(deployment, version, strict=True)
    assert not _errors(validator, deployment)
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, version, strict=True)
    assert _errors(validator, deployment)


@pytest.mark.parametrize("render", ["minimal", "gke", "kuberay"])
def test_raycluster_matches_kuberays_schema(render: str, request: pytest.FixtureRequest) -> None:
    """The RayCluster against KubeRay's ray.io/v1 fields, its pods against core PodTemplateSpec."""
    (cluster,) = kinds(request.getfixturevalue(render), "RayCluster")
    for version in KUBERNETES_VERSIONS:
        errors = sorted(
            _raycluster_validator(version).iter_errors(cluster), key=lambda e: list(e.path)
        )
        assert not errors, [f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors]


@pytest.mark.parametrize(
    ("path", "field"),
    [
        pytest.param(("spec", "workerGroupSpecs", 0), "replica", id="kuberay-field"),
        pytest.param(("spec", "headGroupSpec"), "rayStartParam", id="head-field"),
        pytest.param(
            ("spec", "workerGroupSpecs", 0, "template", "spec", "containers", 0),
            "resource",
            id="pod-template-field",
        ),
    ],
)
def test_raycluster_schema_catches_a_misspelt_field(
    minimal: list[Manifest], path: tuple[str | int, ...], field: str
) -> None:
    """The check above has teeth: unknown fields fail, down into the pod templates."""
    (cluster,) = kinds(minimal, "RayCluster")
    broken = copy.deepcopy(cluster)
    node: Any = broken
    for key in path:
        node = node[key]
    node[field] = 1
    errors = list(_raycluster_validator(KUBERNETES_VERSIONS[0]).iter_errors(broken))
    assert any(f"'{field}' was unexpected" in e.message for e in errors), errors


# -- what a reviewer checks line by line ---------------------------------------------------


@pytest.mark.parametrize("render", ["minimal", "gke"])
def test_no_container_runs_as_root(render: str, request: pytest.FixtureRequest) -> None:
    """Pod Security Standards' restricted profile, for every pod the chart makes, Ray's too."""
    for pod in pods(request.getfixturevalue(render)):
        spec = pod.spec
        assert spec["securityContext"]["runAsNonRoot"] is True, pod.where
        assert spec["securityContext"]["runAsUser"] != 0, pod.where
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", pod.where
        for key in ("hostPID", "hostIPC"):
            assert not spec.get(key), (pod.where, key)
        # The metadata agent alone, to reach its VM's own metadata server (GKE's, in the pod
        # network of a Workload Identity pool, does not serve instance/preempted).
        assert not spec.get("hostNetwork") or pod.metadata["labels"][
            "app.kubernetes.io/component"
        ] == ("metadata-agent"), pod.where
        assert all("hostPath" not in v for v in spec.get("volumes", [])), pod.where
        for container in pod.containers():
            where = f"{pod.where}/{container['name']}"
            context = container["securityContext"]
            assert context.get("runAsNonRoot", True) is True, where
            assert context.get("runAsUser", 1) != 0, where
            assert context["allowPrivilegeEscalation"] is False, where
            assert context.get("privileged", False) is False, where
            assert context["capabilities"]["drop"] == ["ALL"], where
            assert not context["capabilities"].get("add"), where


@pytest.mark.parametrize("render", ["minimal", "gke", "with_ui"])
def test_every_container_has_requests_and_limits(
    render: str, request: pytest.FixtureRequest
) -> None:
    """CPU and memory, requested and limited, so no pod starves a node or is evicted first."""
    for pod in pods(request.getfixturevalue(render)):
        for container in pod.containers():
            resources_ = container["resources"]
            for kind in ("requests", "limits"):
                for resource in ("cpu", "memory"):
                    assert resources_[kind][resource], (pod.where, container["name"], kind)


@pytest.mark.parametrize("render", ["minimal", "gke", "with_ui"])
def test_every_container_has_a_read_only_root_filesystem(
    render: str, request: pytest.FixtureRequest
) -> None:
    """Writable places are emptyDirs with a size limit."""
    for pod in pods(request.getfixturevalue(render)):
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        for container in pod.containers():
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, pod.where
            for mount in container.get("volumeMounts", []):
                volume = volumes[mount["name"]]
                if "emptyDir" in volume:
                    assert volume["emptyDir"]["sizeLimit"], (pod.where, mount["name"])


@pytest.mark.parametrize("render", ["minimal", "gke", "with_ui"])
def test_every_service_is_probed_on_healthz_of_its_http_port(
    render: str, request: pytest.FixtureRequest
) -> None:
    """Startup, readiness and liveness on /healthz, where the service really listens."""
    processes = [(w, c) for w, c in _processes(request.getfixturevalue(render)) if _module(c)]
    assert len(processes) >= 4
    for where, container in processes:
        (port,) = container["ports"]
        assert port["name"] == "http", where
        env = env_of(container)
        (host_var,) = [name for name in env if name.endswith("_HTTP_HOST")]
        assert env[host_var] == "0.0.0.0", where
        assert env[host_var.replace("HOST", "PORT")] == str(port["containerPort"]), where
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, where


def test_two_of_every_service_spread_named_in_the_lease_and_kept_through_a_drain(
    minimal: list[Manifest],
) -> None:
    """Two replicas of each service by default: each names itself in the service's lease
    by its pod's name, they prefer different nodes, an update brings a new pod before an
    old one goes, and a PodDisruptionBudget keeps one through a drain."""
    deployments = kinds(minimal, "Deployment")
    assert {d["metadata"]["name"] for d in deployments} == set(SERVICE_ACCOUNTS.values())
    budgets = {b["metadata"]["name"]: b for b in kinds(minimal, "PodDisruptionBudget")}
    for deployment in deployments:
        name = deployment["metadata"]["name"]
        spec = deployment["spec"]
        assert spec["replicas"] == 2
        assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
        pod = spec["template"]["spec"]
        (term,) = pod["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        selects = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
        assert selects == spec["selector"]["matchLabels"], "its own service's pods"
        env = env_of(pod["containers"][0])
        [replica] = [v for k, v in env.items() if k.endswith("_REPLICA")]
        assert replica == {"fieldRef": {"fieldPath": "metadata.name"}}
        [release] = [v for k, v in env.items() if k.endswith("_RELEASE")]
        assert release.endswith("/spotrain"), "namespace/release: it claims the leases bucket"
        budget = budgets[name]
        assert budget["spec"]["minAvailable"] == 1
        assert budget["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]


def test_one_replica_each_needs_no_disruption_budget(helm: Helm) -> None:
    rendered = helm.render(sets={**REQUIRED_SETS, "serviceReplicas": "1"})
    assert {d["spec"]["replicas"] for d in kinds(rendered, "Deployment")} == {1}
    assert kinds(rendered, "PodDisruptionBudget") == []


def test_all_services_run_one_image_with_their_own_module(gke: list[Manifest]) -> None:
    """One image, four Deployments, each `python -m services.<name>`."""
    images = set()
    modules = set()
    for deployment in kinds(gke, "Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        images.add(container["image"])
        modules.add(_module(container))
    assert images == {"us-central1-docker.pkg.dev/acme-ml/spotrain/spotrain:0.1.0"}
    assert modules == {
        "services.submitter",
        "services.scaler",
        "services.preemption_watcher",
        "services.checkpointer",
    }


def test_an_image_digest_wins_over_the_tag(helm: Helm) -> None:
    digest = "sha256:" + "ab" * 32
    manifests = helm.render(sets={**REQUIRED_SETS, "image.digest": digest})
    for pod in pods(manifests):
        for container in pod.containers():
            assert container["image"] == f"spotrain@{digest}", pod.where


# -- RBAC ----------------------------------------------------------------------------------


def _rules(manifests: Sequence[Manifest], kind: str) -> dict[str, list[dict[str, Any]]]:
    return {m["metadata"]["name"]: m["rules"] for m in kinds(manifests, kind)}


def _bound(manifests: Sequence[Manifest]) -> dict[str, set[str]]:
    """Service account → the roles bound to it."""
    bound: dict[str, set[str]] = {}
    for binding in [*kinds(manifests, "RoleBinding"), *kinds(manifests, "ClusterRoleBinding")]:
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount"
            assert subject["namespace"] == NAMESPACE
            bound.setdefault(subject["name"], set()).add(binding["roleRef"]["name"])
    return bound


@pytest.mark.parametrize("render", ["minimal", "gke", "kuberay"])
def test_rbac_grants_no_wildcard_and_no_builtin_admin_role(
    render: str, request: pytest.FixtureRequest
) -> None:
    manifests: list[Manifest] = request.getfixturevalue(render)
    for kind in ("Role", "ClusterRole"):
        for name, rules in _rules(manifests, kind).items():
            for rule in rules:
                for key in ("verbs", "resources", "apiGroups"):
                    assert "*" not in rule.get(key, []), (name, rule)
                for verb in ("escalate", "bind", "impersonate", "create", "delete"):
                    assert verb not in rule["verbs"], (name, rule)
    for binding in [*kinds(manifests, "RoleBinding"), *kinds(manifests, "ClusterRoleBinding")]:
        assert binding["roleRef"]["name"] not in {"cluster-admin", "admin", "edit", "view"}


def test_rbac_gke_provider(minimal: list[Manifest]) -> None:
    """The watcher reads Nodes; the gke scaler lists them; nobody touches RayClusters."""
    assert _rules(minimal, "ClusterRole") == {
        "spotrain-preemption-watcher-nodes": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
        ],
        "spotrain-scaler-nodes": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
    }
    assert kinds(minimal, "Role") == []
    assert _bound(minimal) == {
        "spotrain-preemption-watcher": {"spotrain-preemption-watcher-nodes"},
        "spotrain-scaler": {"spotrain-scaler-nodes"},
    }


def test_rbac_kuberay_provider_patches_only_this_raycluster(kuberay: list[Manifest]) -> None:
    """Only with the kuberay provider may the scaler patch a RayCluster: this release's one;
    it lists pods (its workers), and writes none."""
    assert _rules(kuberay, "Role") == {
        "spotrain-scaler-raycluster": [
            {
                "apiGroups": ["ray.io"],
                "resources": ["rayclusters"],
                "resourceNames": [RELEASE],
                "verbs": ["get", "patch"],
            },
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        ]
    }
    assert set(_rules(kuberay, "ClusterRole")) == {"spotrain-preemption-watcher-nodes"}
    assert _bound(kuberay)["spotrain-scaler"] == {"spotrain-scaler-raycluster"}
    (cluster,) = kinds(kuberay, "RayCluster")
    assert cluster["metadata"]["name"] == RELEASE


def test_kuberay_scaler_is_pointed_at_this_releases_raycluster(kuberay: list[Manifest]) -> None:
    """The RayCluster the scaler patches is the one the chart renders, in its namespace."""
    (container,) = named(kuberay, "Deployment", "spotrain-scaler")["spec"]["template"]["spec"][
        "containers"
    ]
    env = env_of(container)
    (cluster,) = kinds(kuberay, "RayCluster")
    assert env["SPOTRAIN_SCALER_PROVIDER"] == "kuberay"
    assert env["SPOTRAIN_SCALER_KUBERAY_CLUSTER"] == cluster["metadata"]["name"]
    assert env["SPOTRAIN_SCALER_KUBERAY_NAMESPACE"] == NAMESPACE
    assert not [name for name in env if name.startswith("SPOTRAIN_SCALER_GKE_")]


def test_watcher_without_k8s_source_gets_no_rbac_and_no_token(helm: Helm) -> None:
    manifests = helm.render(
        sets={
            **REQUIRED_SETS,
            "preemptionWatcher.settings.sources": "{gce-pubsub}",
            "preemptionWatcher.settings.pubsub_subscription": "projects/p/subscriptions/s",
        }
    )
    assert "spotrain-preemption-watcher" not in _bound(manifests)
    watcher = named(manifests, "Deployment", "spotrain-preemption-watcher")
    assert watcher["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("render", ["minimal", "gke", "kuberay", "with_ui"])
def test_only_pods_that_call_the_kubernetes_api_get_a_token(
    render: str, request: pytest.FixtureRequest
) -> None:
    manifests: list[Manifest] = request.getfixturevalue(render)
    bound = _bound(manifests)
    for service_account in kinds(manifests, "ServiceAccount"):
        assert service_account["automountServiceAccountToken"] is False
    for pod in pods(manifests):
        account = pod.spec.get("serviceAccountName")
        assert pod.spec["automountServiceAccountToken"] is (account in bound), pod.where


# -- settings: one-to-one, and enough to start ----------------------------------------------


@pytest.mark.parametrize("render", ["minimal", "gke", "kuberay", "with_ui"])
def test_every_env_var_is_a_setting_the_process_reads(
    render: str, request: pytest.FixtureRequest
) -> None:
    """No SPOTRAIN_* variable a process would silently ignore (settings ignore extras)."""
    for where, container in _processes(request.getfixturevalue(render)):
        module = _module(container)
        read = _env_names(BusSettings)
        if module is not None:
            read |= _env_names(SETTINGS_BY_MODULE[module])
        names = [e["name"] for e in container["env"]]
        assert len(names) == len(set(names)), (where, names)
        unknown = {n for n in names if n.startswith("SPOTRAIN_")} - read
        assert not unknown, (where, unknown)


@pytest.mark.parametrize("render", ["minimal", "gke", "kuberay", "with_ui"])
def test_every_process_starts_with_its_rendered_settings(
    render: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Each settings class validates from exactly the rendered env: what it requires is set."""
    manifests: list[Manifest] = request.getfixturevalue(render)
    pools_file = tmp_path / "pools.toml"
    pools_file.write_text(named(manifests, "ConfigMap", "spotrain-pools")["data"]["pools.toml"])
    for where, container in _processes(manifests):
        for name in [n for n in os.environ if n.startswith("SPOTRAIN_")]:
            monkeypatch.delenv(name)
        for name, rendered in env_of(container).items():
            # The node's name from the downward API: what the kubelet would give.
            node = {"fieldRef": {"fieldPath": "spec.nodeName"}}
            pod = {"fieldRef": {"fieldPath": "metadata.name"}}
            value = "gke-training-gpu-spot-3f9a1c2b-x7kq" if rendered == node else rendered
            value = "spotrain-scaler-7d9f8c6b5-x2kq4" if rendered == pod else value
            if isinstance(value, dict) and "secretKeyRef" in value:
                value = "a-value-from-a-secret"  # what the kubelet reads from the Secret
            assert isinstance(value, str), (where, name, value)
            monkeypatch.setenv(name, value)
        if "SPOTRAIN_SCALER_POOLS_FILE" in env_of(container):
            monkeypatch.setenv("SPOTRAIN_SCALER_POOLS_FILE", str(pools_file))
        try:
            bus = BusSettings()
            module = _module(container)
            if module is not None:
                SETTINGS_BY_MODULE[module]()
        except ValidationError as error:
            pytest.fail(f"{where}: {error}")
        assert bus.nats_url.startswith("nats://"), where


def test_rendered_settings_say_what_the_values_say(
    gke: list[Manifest], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The production example, read back through the services' own settings classes."""

    def load(deployment: str) -> None:
        (container,) = named(gke, "Deployment", deployment)["spec"]["template"]["spec"][
            "containers"
        ]
        for name, value in env_of(container).items():
            if isinstance(value, str):  # not one the kubelet reads from a Secret
                monkeypatch.setenv(name, value)

    load("spotrain-scaler")
    pools_file = tmp_path / "pools.toml"
    pools_file.write_text(named(gke, "ConfigMap", "spotrain-pools")["data"]["pools.toml"])
    monkeypatch.setenv("SPOTRAIN_SCALER_POOLS_FILE", str(pools_file))
    scaler = ScalerSettings()
    example = _values(GKE_EXAMPLE)
    assert scaler.provider == "gke"
    assert (scaler.gke_project, scaler.gke_location, scaler.gke_cluster) == (
        "acme-ml",
        "us-central1",
        "training",
    )
    pools = scaler.pools()
    assert [p.name for p in pools] == [p["name"] for p in example["pools"]]
    assert [p.zone for p in pools] == [p.get("zone") for p in example["pools"]]
    assert len({p.zone for p in pools if p.capacity is CapacityClass.SPOT}) == 2, "two markets"
    assert scaler.gke_node_pools == {p.name: p.name for p in pools}
    assert scaler.ray_gcs_address == "spotrain-head-svc:6379"
    assert scaler.budget_per_hour_usd == 40.0

    load("spotrain-submitter")
    submitter = SubmitterSettings()
    assert submitter.checkpoint_root == "gs://acme-ml-spotrain/checkpoints"
    assert submitter.ray_address == "http://spotrain-head-svc:8265"

    load("spotrain-preemption-watcher")
    watcher = PreemptionWatcherSettings()
    assert list(watcher.sources) == ["gce-pubsub", "k8s"]
    assert watcher.pubsub_subscription == "projects/acme-ml/subscriptions/spotrain-preemptions"

    bus = BusSettings()
    assert bus.nats_url == "nats://nats.nats.svc.cluster.local:4222"
    assert bus.replicas == 3
    assert bus.nats_creds_file == "/var/run/secrets/spotrain/nats/nats.creds"


def test_each_process_has_its_own_nats_credentials_secret(gke: list[Manifest]) -> None:
    """One Secret per process, mounted read-only where SPOTRAIN_NATS_CREDS_FILE points (the
    metadata agents, one DaemonSet per spot pool, are one process: they share theirs)."""
    secrets = []
    for pod in pods(gke):
        if pod.where.startswith("RayCluster/"):
            continue
        (container,) = pod.spec["containers"]
        volumes = {v["name"]: v for v in pod.spec["volumes"]}
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "nats-creds"]
        assert mount["readOnly"] is True
        creds_file = env_of(container)["SPOTRAIN_NATS_CREDS_FILE"]
        assert Path(creds_file).parent == Path(mount["mountPath"]), pod.where
        secret = volumes["nats-creds"]["secret"]
        assert [item["path"] for item in secret["items"]] == [Path(creds_file).name]
        secrets.append(secret["secretName"])
    agent = "spotrain-nats-metadata-agent"
    spot_pools = [p for p in _values(GKE_EXAMPLE)["pools"] if p["capacity"] == "spot"]
    assert secrets.count(agent) == len(spot_pools) == 2, secrets
    others = [s for s in secrets if s != agent]
    assert len(others) == len(set(others)) == 5, secrets


def test_role_environment_files_are_loaded_whole_from_one_secret_per_process(
    helm: Helm,
) -> None:
    """`type: env`: each process loads its role's `spotrain nats-config` file from its Secret."""
    manifests = helm.render(
        sets={
            **REQUIRED_SETS,
            "natsCredentials.enabled": "true",
            "natsCredentials.type": "env",
            "metadataAgent.enabled": "true",
        }
    )
    secrets = []
    for where, container in _processes(manifests):
        (source,) = container["envFrom"]
        secrets.append(source["secretRef"]["name"])
        assert "SPOTRAIN_NATS_CREDS_FILE" not in env_of(container), where
        assert all(m["name"] != "nats-creds" for m in container["volumeMounts"]), where
    assert len(secrets) == len(set(secrets)) == 6, secrets


def test_no_credentials_volume_without_credentials(helm: Helm) -> None:
    without = helm.render(sets={**REQUIRED_SETS, "natsCredentials.enabled": "false"})
    for where, container in _processes(without):
        assert "SPOTRAIN_NATS_CREDS_FILE" not in env_of(container), where


def test_credentials_are_on_by_default(minimal: list[Manifest]) -> None:
    """A server that requires them refuses a process without; one that does not would let
    anyone act as anyone: every process carries its own unless the values say otherwise."""
    for where, container in _processes(minimal):
        assert "SPOTRAIN_NATS_CREDS_FILE" in env_of(container), where


def test_rays_token_goes_to_ray_and_the_services_that_drive_it_only(
    minimal: list[Manifest],
) -> None:
    token = {"secretKeyRef": {"name": "spotrain-ray-token", "key": "token"}}
    holders = set()
    for pod in pods(minimal):
        for container in pod.spec["containers"]:
            env = env_of(container)
            if env.get("RAY_AUTH_TOKEN") == token:
                assert env["RAY_AUTH_MODE"] == "token", pod.where
                holders.add(pod.metadata["labels"]["app.kubernetes.io/component"])
    ray = {"ray-head", "ray-worker", "ray-driver"}
    assert holders == {"submitter", "scaler", "checkpointer", *ray}


def test_each_teams_secrets_are_its_own_folder(helm: Helm) -> None:
    """A job reads its own team's folder of secrets only: each team's Secret is mounted at
    secrets/<team>, where the submitter looks for that team's jobs."""
    rendered = helm.render(
        sets={
            **REQUIRED_SETS,
            "submitter.teamSecrets.vision": "spotrain-secrets-vision",
            "submitter.teamSecrets.nlp": "spotrain-secrets-nlp",
        }
    )
    pod = named(rendered, "Deployment", "spotrain-submitter")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert env_of(container)["SPOTRAIN_SUBMITTER_SECRETS_DIR"] == "/var/run/spotrain/secrets"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    mounted = {mounts[name]: secret for name, secret in secrets.items() if name in mounts}
    assert mounted["/var/run/spotrain/secrets/vision"] == "spotrain-secrets-vision"
    assert mounted["/var/run/spotrain/secrets/nlp"] == "spotrain-secrets-nlp"
    assert "/var/run/spotrain/secrets" not in mounted, "no secrets for every team"


# -- Workload Identity ---------------------------------------------------------------------


def test_gke_example_binds_scaler_and_watcher_to_gcp_service_accounts(
    gke: list[Manifest],
) -> None:
    """Node pool resize and the Pub/Sub subscription go through Workload Identity."""
    accounts = {a["metadata"]["name"]: a for a in kinds(gke, "ServiceAccount")}
    expected = {
        "spotrain-scaler": "spotrain-scaler@acme-ml.iam.gserviceaccount.com",
        "spotrain-preemption-watcher": "spotrain-watcher@acme-ml.iam.gserviceaccount.com",
        "spotrain-submitter": "spotrain-submitter@acme-ml.iam.gserviceaccount.com",
        "spotrain-checkpointer": "spotrain-checkpointer@acme-ml.iam.gserviceaccount.com",
        "spotrain-ray": "spotrain-ray@acme-ml.iam.gserviceaccount.com",
    }
    for name, email in expected.items():
        assert accounts[name]["metadata"]["annotations"] == {WORKLOAD_IDENTITY: email}
    for deployment, account in SERVICE_ACCOUNTS.items():
        pod = named(gke, "Deployment", f"spotrain-{deployment}")["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == account
    assert "annotations" not in accounts["spotrain-metadata-agent"]["metadata"]


def test_no_workload_identity_unless_asked(minimal: list[Manifest]) -> None:
    for account in kinds(minimal, "ServiceAccount"):
        assert WORKLOAD_IDENTITY not in account["metadata"].get("annotations", {})


# -- the RayCluster ------------------------------------------------------------------------


@pytest.mark.parametrize("render", ["minimal", "gke", "kuberay"])
def test_worker_groups_declare_the_labels_and_resources_the_platform_relies_on(
    render: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Each Ray node says its Kubernetes node and pool (labels, in the file its init
    container writes, run here with sh) and its pool and capacity (custom resources),
    parsed as bash and Ray would parse KubeRay's `ray start` line; and the operator's own
    validation (KubeRay v1.5) accepts the spec."""
    from ray._private.label_utils import parse_node_labels_from_yaml_file  # noqa: PLC0415

    manifests: list[Manifest] = request.getfixturevalue(render)
    (cluster,) = kinds(manifests, "RayCluster")
    assert ray_cluster_errors(cluster["spec"]) == []
    values = _values(GKE_EXAMPLE if render == "gke" else CHART / "values.yaml")
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    assert list(groups) == [*(p["name"] for p in values["pools"]), DRIVERS_GROUP]
    for pool in values["pools"]:
        group = groups[pool["name"]]
        params = group["rayStartParams"]
        line = " ".join(f"--{k}={v}" for k, v in params.items())
        node = "gke-training-gpu-spot-3f9a1c2b-x7kq"
        argv = dict(arg[2:].split("=", 1) for arg in shlex.split(line))
        spec = group["template"]["spec"]
        (init,) = spec["initContainers"]
        assert env_of(init)["SPOTRAIN_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        labels_file = tmp_path / f"{pool['name']}.yaml"
        script = init["command"][2].replace(argv["labels-file"], str(labels_file))
        written = subprocess.run(
            [*init["command"][:2], script],
            env={"SPOTRAIN_NODE_NAME": node, "PATH": os.environ["PATH"]},
            check=False,
        )
        assert written.returncode == 0
        labels = parse_node_labels_from_yaml_file(str(labels_file))
        assert labels == {NODE_LABEL: node, POOL_LABEL: pool["name"]}
        capacity = capacity_resource(CapacityClass(pool["capacity"]))
        assert json.loads(argv["resources"]) == {
            pool_resource(pool["name"]): RESOURCE_PER_NODE,
            capacity: RESOURCE_PER_NODE,
        }
        assert float(argv["num-cpus"]) == pool["cpus"]
        assert int(argv["num-gpus"]) == pool["gpus"]

        (container,) = spec["containers"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert {m["name"]: m["mountPath"] for m in init["volumeMounts"]}.items() <= mounts.items()
        assert spec["nodeSelector"] == {"cloud.google.com/gke-nodepool": pool["name"]}
        taints = {t["key"] for t in spec.get("tolerations", [])}
        assert ("cloud.google.com/gke-spot" in taints) == (pool["capacity"] == "spot")
        assert ("nvidia.com/gpu" in taints) == (pool["gpus"] > 0)
        limits = container["resources"]["limits"]
        assert container["resources"]["requests"] == limits
        assert int(limits.get("nvidia.com/gpu", 0)) == pool["gpus"]
        assert float(limits["cpu"]) == pool["cpus"]


def test_worker_groups_hold_a_pod_per_node_the_scaler_may_add(
    minimal: list[Manifest], kuberay: list[Manifest]
) -> None:
    """gke: pods wait for the nodes the scaler adds; kuberay: the scaler patches replicas."""
    pools = {p["name"]: p for p in _values()["pools"]}
    for manifests, replicas in ((minimal, "max_nodes"), (kuberay, "min_nodes")):
        (cluster,) = kinds(manifests, "RayCluster")
        assert cluster["spec"]["enableInTreeAutoscaling"] is False
        for group in cluster["spec"]["workerGroupSpecs"]:
            if group["groupName"] == DRIVERS_GROUP:
                continue  # not a pool: a fixed size (test_multi_node_drivers_...)
            pool = pools[group["groupName"]]
            assert group["replicas"] == pool[replicas]
            assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
            assert group["maxReplicas"] == pool["max_nodes"]
            anti = group["template"]["spec"]["affinity"]["podAntiAffinity"]
            (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
            assert term["topologyKey"] == "kubernetes.io/hostname"
            labels = group["template"]["metadata"]["labels"]
            assert term["labelSelector"]["matchLabels"].items() <= labels.items()


def test_ray_head_runs_on_the_platform_pool_and_takes_no_work(gke: list[Manifest]) -> None:
    (cluster,) = kinds(gke, "RayCluster")
    head = cluster["spec"]["headGroupSpec"]
    assert head["template"]["spec"]["nodeSelector"] == {"cloud.google.com/gke-nodepool": "system"}
    assert "tolerations" not in head["template"]["spec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert head["rayStartParams"]["num-gpus"] == "0"
    pool_names = {g["groupName"] for g in cluster["spec"]["workerGroupSpecs"]}
    assert "system" not in pool_names


DRIVERS_GROUP = "drivers"
COMPONENT = "app.kubernetes.io/component"


def test_multi_node_drivers_run_on_a_group_of_their_own_that_the_submitter_selects(
    gke: list[Manifest], tmp_path: Path
) -> None:
    """No job code on the head, where Ray's job API is: the drivers' group has the labels
    (written by its init container, run here with sh) that the submitter selects drivers
    by, offers no CPU or GPU, so nothing else lands there, and runs on on-demand nodes."""
    from ray._private.label_utils import parse_node_labels_from_yaml_file  # noqa: PLC0415

    (cluster,) = kinds(gke, "RayCluster")
    [drivers] = [g for g in cluster["spec"]["workerGroupSpecs"] if g["groupName"] == "drivers"]
    assert drivers["rayStartParams"]["num-cpus"] == "0"
    assert drivers["rayStartParams"]["num-gpus"] == "0"
    assert drivers["replicas"] == drivers["minReplicas"] == drivers["maxReplicas"] >= 1
    spec = drivers["template"]["spec"]
    (init,) = spec["initContainers"]
    labels_file = tmp_path / "drivers.yaml"
    script = init["command"][2].replace(drivers["rayStartParams"]["labels-file"], str(labels_file))
    subprocess.run([*init["command"][:2], script], check=True)
    labels = parse_node_labels_from_yaml_file(str(labels_file))
    [submitter] = [p for p in pods(gke) if p.metadata["labels"].get(COMPONENT) == "submitter"]
    (container,) = submitter.spec["containers"]
    assert json.loads(env_of(container)["SPOTRAIN_SUBMITTER_DRIVER_LABELS"]) == labels
    assert labels == {"spotrain-role": "driver"}
    assert drivers["template"]["metadata"]["labels"][COMPONENT] == "ray-driver"
    assert spec["nodeSelector"] == {"cloud.google.com/gke-nodepool": "system"}
    assert "affinity" not in spec, "no pool worker's one-per-node rule applies"


def test_without_a_drivers_group_the_submitter_leaves_drivers_on_the_head(helm: Helm) -> None:
    rendered = helm.render(sets={**REQUIRED_SETS, "ray.drivers.enabled": "false"})
    (cluster,) = kinds(rendered, "RayCluster")
    assert DRIVERS_GROUP not in [g["groupName"] for g in cluster["spec"]["workerGroupSpecs"]]
    [submitter] = [p for p in pods(rendered) if p.metadata["labels"].get(COMPONENT) == "submitter"]
    assert "SPOTRAIN_SUBMITTER_DRIVER_LABELS" not in env_of(submitter.spec["containers"][0])


def test_a_pool_may_not_take_the_drivers_groups_name(helm: Helm, tmp_path: Path) -> None:
    pools = _values()["pools"]
    renamed = tmp_path / "pools.yaml"
    renamed.write_text(yaml.safe_dump({"pools": [{**pools[0], "name": DRIVERS_GROUP}]}))
    result = helm.template(values=[renamed])
    assert result.returncode != 0
    assert "pool drivers has the name of the drivers' group" in result.stderr


# -- the rest of the chart -----------------------------------------------------------------


def test_jetstream_is_declared_by_a_hook_before_install_and_upgrade(
    minimal: list[Manifest],
) -> None:
    (job,) = kinds(minimal, "Job")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    script = (CHART / "files" / "declare_jetstream.py").read_text()
    assert container["command"] == ["python", "-c"]
    assert container["args"] == [script]


def test_metadata_agent_runs_on_every_spot_pool_and_nowhere_else(
    helm: Helm, gke: list[Manifest], minimal: list[Manifest]
) -> None:
    assert kinds(minimal, "DaemonSet") == []
    spot = [p["name"] for p in _values(GKE_EXAMPLE)["pools"] if p["capacity"] == "spot"]
    agents = kinds(gke, "DaemonSet")
    assert [a["metadata"]["name"] for a in agents] == [f"spotrain-metadata-agent-{p}" for p in spot]
    values = _values(CHART / "values.yaml")
    for agent, pool in zip(agents, spot, strict=True):
        pod = agent["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"cloud.google.com/gke-nodepool": pool}
        (container,) = pod["containers"]
        env = env_of(container)
        assert env["SPOTRAIN_METADATA_AGENT_POOL"] == pool
        # Issue 20, 2: the VM's own metadata server (the host's network), and the node's
        # name from the pod, as GKE's metadata server serves neither preempted nor name.
        assert pod["hostNetwork"] is True
        assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert env["SPOTRAIN_METADATA_AGENT_NODE"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        port = values["metadataAgent"]["httpPort"]
        assert env["SPOTRAIN_METADATA_AGENT_HTTP_PORT"] == str(port)
        assert [p["containerPort"] for p in container["ports"]] == [port]
        assert port != values["httpPort"]


def test_pod_monitoring_selects_the_services_metrics_port(gke: list[Manifest]) -> None:
    monitoring = named(gke, "PodMonitoring", "spotrain")
    assert monitoring["apiVersion"] == "monitoring.googleapis.com/v1"
    selector = monitoring["spec"]["selector"]
    (expression,) = selector["matchExpressions"]
    assert monitoring["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "30s"}
    ]
    for pod in pods(gke):
        labels = pod.metadata["labels"]
        component = labels["app.kubernetes.io/component"]
        if component in expression["values"]:
            assert selector["matchLabels"].items() <= labels.items()
            assert any(p["name"] == "http" for p in pod.spec["containers"][0]["ports"])


def test_pod_monitor_for_prometheus_operator(helm: Helm) -> None:
    manifests = helm.render(
        sets={
            **REQUIRED_SETS,
            "metrics.podMonitor.enabled": "true",
            "metrics.podMonitor.labels.release": "kube-prometheus",
        }
    )
    monitor = named(manifests, "PodMonitor", "spotrain")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert monitor["spec"]["podMetricsEndpoints"][0]["path"] == "/metrics"


def test_every_ray_pod_is_scraped_on_its_metrics_port(gke: list[Manifest], helm: Helm) -> None:
    """Ray's own exporter is where device GPU figures come from (the dashboards' device
    panel): the head and every worker group are selected, on the port they expose."""
    operator = helm.render(sets={**REQUIRED_SETS, "metrics.podMonitor.enabled": "true"})
    for monitor, endpoints in (
        (named(gke, "PodMonitoring", "spotrain-ray"), "endpoints"),
        (named(operator, "PodMonitor", "spotrain-ray"), "podMetricsEndpoints"),
    ):
        selector = monitor["spec"]["selector"]
        (expression,) = selector["matchExpressions"]
        [endpoint] = monitor["spec"][endpoints]
        assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
        ray_pods = [p for p in pods(gke) if p.where.startswith("RayCluster/")]
        assert len(ray_pods) >= 2, "a head and at least one worker group"
        for pod in ray_pods:
            labels = pod.metadata["labels"]
            assert selector["matchLabels"].items() <= labels.items(), pod.where
            assert labels["app.kubernetes.io/component"] in expression["values"], pod.where
            ports = pod.spec["containers"][0]["ports"]
            assert any(p["name"] == "metrics" for p in ports), pod.where


def test_dashboards_become_configmaps_for_grafanas_sidecar(helm: Helm, tmp_path: Path) -> None:
    """Every dashboards/*.json of the chart, verbatim, in a ConfigMap Grafana picks up."""
    chart = tmp_path / "spotrain"
    shutil.copytree(CHART, chart)
    dashboard = {"title": "spotrain overview", "panels": []}
    (chart / "dashboards").mkdir(exist_ok=True)
    (chart / "dashboards" / "test-overview.json").write_text(json.dumps(dashboard))
    manifests = helm.render(
        sets={**REQUIRED_SETS, "metrics.dashboards.enabled": "true"}, chart=chart
    )
    maps = [m for m in kinds(manifests, "ConfigMap") if "test-overview.json" in m.get("data", {})]
    (configmap,) = maps
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["test-overview.json"]) == dashboard


def test_a_teams_file_reaches_the_submitter_and_parses(helm: Helm, tmp_path: Path) -> None:
    """`teams` becomes the submitter's SPOTRAIN_TEAMS_FILE, mounted as a folder (so the
    kubelet updates it in place and the submitter reads the edit); empty: no teams."""
    text = '[teams.vision]\nmembers = ["alice"]\n[teams.vision.quota.spot]\nguaranteed_gpus = 8\n'
    values = tmp_path / "teams-values.yaml"
    values.write_text(json.dumps({"teams": text}))
    manifests = helm.render(values=[values])
    config = named(manifests, "ConfigMap", "spotrain-teams")
    assert parse_teams(config["data"]["teams.toml"]).teams["vision"].members == ("alice",)
    spec = named(manifests, "Deployment", "spotrain-submitter")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert env_of(container)["SPOTRAIN_TEAMS_FILE"] == "/etc/spotrain/teams.toml"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "teams")
    assert mount == {"name": "teams", "mountPath": "/etc/spotrain", "readOnly": True}
    assert "subPath" not in mount
    volume = next(v for v in spec["volumes"] if v["name"] == "teams")
    assert volume["configMap"]["name"] == "spotrain-teams"
    plain = helm.render()
    assert not [m for m in plain if m["metadata"]["name"] == "spotrain-teams"]
    (container,) = named(plain, "Deployment", "spotrain-submitter")["spec"]["template"]["spec"][
        "containers"
    ]
    assert "SPOTRAIN_TEAMS_FILE" not in env_of(container)


def test_job_secrets_are_mounted_into_the_submitter_only(helm: Helm) -> None:
    manifests = helm.render(sets={**REQUIRED_SETS, "submitter.secretsName": "ml-secrets"})
    spec = named(manifests, "Deployment", "spotrain-submitter")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert env_of(container)["SPOTRAIN_SUBMITTER_SECRETS_DIR"] == "/var/run/spotrain/secrets"
    volume = next(v for v in spec["volumes"] if v["name"] == "job-secrets")
    assert volume["secret"]["secretName"] == "ml-secrets"
    for pod in pods(manifests):
        if pod.where != "Deployment/spotrain-submitter":
            assert "job-secrets" not in json.dumps(pod.spec), pod.where


def test_an_upgrade_keeps_the_replicas_and_workers_to_delete_the_scaler_set(
    helm: Helm, tmp_path: Path
) -> None:
    """Issue 20, 8: with the kuberay provider an upgrade renders each group's replicas and
    workersToDelete from the live RayCluster (helm's lookup, against a fake API server),
    within the pool's bounds; a group not live yet starts at min_nodes."""
    pools = {p["name"]: p for p in _values()["pools"]}
    first, second = list(pools)[:2]
    live = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": RELEASE},
        "spec": {
            "workerGroupSpecs": [
                {
                    "groupName": first,
                    "replicas": pools[first]["max_nodes"] - 1,
                    "scaleStrategy": {"workersToDelete": ["spotrain-gpu-spot-worker-x7k2p"]},
                },
                {"groupName": second, "replicas": pools[second]["max_nodes"] + 5},
            ]
        },
    }
    fake = FakeKubeRay(namespace=NAMESPACE)
    fake.add_cluster(live)
    result = _against(helm, fake, tmp_path, {"scaler.settings.provider": "kuberay"})
    assert result.returncode == 0, result.stderr
    manifests = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    (cluster,) = kinds(manifests, "RayCluster")
    groups = {g["groupName"]: g for g in cluster["spec"]["workerGroupSpecs"]}
    assert groups[first]["replicas"] == pools[first]["max_nodes"] - 1
    assert groups[first]["scaleStrategy"] == {"workersToDelete": ["spotrain-gpu-spot-worker-x7k2p"]}
    assert groups[second]["replicas"] == pools[second]["max_nodes"], "within the bounds"
    assert "scaleStrategy" not in groups[second]
    for name in list(pools)[2:]:
        assert groups[name]["replicas"] == pools[name]["min_nodes"]
    assert ray_cluster_errors(cluster["spec"]) == []


def _against(
    helm: Helm, fake: FakeKubeRay, tmp_path: Path, sets: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """`helm template` as an upgrade against a fake API server (`--dry-run=server`), where
    `lookup` and the server's API versions are real."""
    with serve_fake_kuberay(fake) as kube:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": kube.endpoint}}],
                    "contexts": [{"name": "fake", "context": {"cluster": "fake"}}],
                    "current-context": "fake",
                    "users": [{"name": "fake", "user": {}}],
                }
            )
        )
        return helm.template(
            sets={**REQUIRED_SETS, **sets},
            extra=[
                "--dry-run=server",
                "--is-upgrade",
                "--disable-openapi-validation",
                "--kubeconfig",
                str(kubeconfig),
            ],
        )


def test_an_install_on_a_cluster_without_kuberay_fails_naming_the_fix(
    helm: Helm, tmp_path: Path
) -> None:
    """Issue 20, bad input: no ray.io/v1 RayCluster served (KubeRay missing, or too old):
    one line that says what to install, before anything is created."""
    result = _against(helm, FakeKubeRay(namespace=NAMESPACE, serves_ray=False), tmp_path, {})
    assert result.returncode != 0
    assert "the cluster serves no ray.io/v1 RayCluster: install the KubeRay operator" in (
        result.stderr
    )
    assert _against(helm, FakeKubeRay(namespace=NAMESPACE), tmp_path, {}).returncode == 0
