"""The chart's NetworkPolicies, read as Kubernetes reads them: for each pod the chart runs
(and NATS's, and a scraper's), which may reach which port. Job code runs in the Ray pods:
they reach Ray's own ports and nothing of the platform's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from tests.helm.chart import NAMESPACE, REQUIRED_SETS, Helm, Manifest, kinds, pods

pytestmark = pytest.mark.helm


@dataclass(frozen=True)
class Peer:
    name: str
    namespace: str
    labels: Mapping[str, str]
    namespace_labels: Mapping[str, str] | None = None
    """Its namespace's labels; Kubernetes gives each its name's at least."""

    @property
    def namespace_labeled(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace, **(self.namespace_labels or {})}


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        present = key in labels
        match operator:
            case "In":
                ok = present and labels[key] in values
            case "NotIn":
                ok = not present or labels[key] not in values
            case "Exists":
                ok = present
            case "DoesNotExist":
                ok = not present
            case _:
                raise AssertionError(f"unknown operator {operator}")
        if not ok:
            return False
    return True


def _peer_matches(peer: Mapping[str, Any], source: Peer, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        return False  # no pod of these tests comes from an address block
    namespaces = peer.get("namespaceSelector")
    if namespaces is None:
        in_namespace = source.namespace == policy_namespace
    else:
        in_namespace = _selects(namespaces, source.namespace_labeled)
    pods_selector = peer.get("podSelector")
    return in_namespace and (pods_selector is None or _selects(pods_selector, source.labels))


def _port_matches(ports: Sequence[Mapping[str, Any]] | None, port: int) -> bool:
    if not ports:
        return True
    return any(p["port"] <= port <= p.get("endPort", p["port"]) for p in ports)


def may_reach(policies: Sequence[Manifest], source: Peer, target: Peer, port: int) -> bool:
    """What Kubernetes allows: every connection to a pod no policy selects; else one that
    some rule of a policy selecting the pod lets in."""
    selecting = [
        p
        for p in policies
        if p["metadata"].get("namespace", NAMESPACE) == target.namespace
        and _selects(p["spec"]["podSelector"], target.labels)
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
    ]
    if not selecting:
        return True
    for policy in selecting:
        namespace = policy["metadata"].get("namespace", NAMESPACE)
        for rule in policy["spec"].get("ingress") or []:
            peers = rule.get("from")
            from_ok = not peers or any(_peer_matches(p, source, namespace) for p in peers)
            if from_ok and _port_matches(rule.get("ports"), port):
                return True
    return False


@pytest.fixture(scope="module")
def rendered(helm: Helm) -> list[Manifest]:
    return helm.render(
        sets={**REQUIRED_SETS, "metadataAgent.enabled": "false"},
    )


def _peers(manifests: Sequence[Manifest]) -> dict[str, Peer]:
    found = {}
    for pod in pods(manifests):
        labels = pod.metadata.get("labels", {})
        component = labels.get("app.kubernetes.io/component")
        if component:
            found[component] = Peer(component, NAMESPACE, labels)
    found["nats"] = Peer("nats", "nats", {"app.kubernetes.io/name": "nats"})
    found["prometheus"] = Peer("prometheus", "monitoring", {"app": "prometheus"})
    found["a-pod-elsewhere"] = Peer("a-pod-elsewhere", "default", {"app": "x"})
    return found


HTTP = 9460
"""The services' one port (/metrics, /healthz): values.yaml's httpPort."""


@pytest.mark.parametrize(
    ("source", "target", "port", "allowed"),
    [
        # Job code (Ray's pods) reaches nothing of the platform's.
        pytest.param("ray-worker", "nats", 4222, False, id="job-to-nats"),
        pytest.param("ray-head", "nats", 4222, False, id="head-to-nats"),
        pytest.param("ray-driver", "nats", 4222, False, id="driver-to-nats"),
        pytest.param("ray-driver", "ray-head", 8265, False, id="driver-to-the-job-api"),
        pytest.param("ray-driver", "submitter", HTTP, False, id="driver-to-submitter"),
        pytest.param("ray-worker", "submitter", HTTP, False, id="job-to-submitter-metrics"),
        pytest.param("ray-worker", "scaler", HTTP, False, id="job-to-scaler"),
        pytest.param("ray-worker", "ray-head", 8265, False, id="job-to-the-job-api"),
        # ... and Ray's own ports, to run at all.
        pytest.param("ray-worker", "ray-head", 6379, True, id="job-to-gcs"),
        pytest.param("ray-worker", "ray-worker", 10002, True, id="worker-to-worker"),
        pytest.param("ray-driver", "ray-head", 6379, True, id="driver-to-gcs"),
        pytest.param("ray-driver", "ray-worker", 10002, True, id="driver-to-its-workers"),
        pytest.param("ray-worker", "ray-driver", 10002, True, id="workers-to-their-driver"),
        # The platform reaches what it drives.
        pytest.param("submitter", "ray-head", 8265, True, id="submitter-to-the-job-api"),
        pytest.param("checkpointer", "ray-head", 6379, True, id="checkpointer-drains"),
        pytest.param("submitter", "nats", 4222, True, id="submitter-to-nats"),
        pytest.param("preemption-watcher", "nats", 4222, True, id="watcher-to-nats"),
        pytest.param("nats", "nats", 6222, True, id="nats-routes"),
        # Scrapers read metrics; nobody else calls a service.
        pytest.param("prometheus", "submitter", HTTP, True, id="scraped"),
        pytest.param("prometheus", "ray-head", 8080, True, id="ray-scraped"),
        pytest.param("a-pod-elsewhere", "submitter", HTTP, False, id="no-one-else"),
        pytest.param("a-pod-elsewhere", "nats", 4222, False, id="nats-keeps-others-out"),
        pytest.param("a-pod-elsewhere", "ray-head", 8265, False, id="job-api-keeps-others-out"),
    ],
)
def test_job_pods_reach_rays_ports_and_nothing_of_the_platforms(
    rendered: list[Manifest], source: str, target: str, port: int, allowed: bool
) -> None:
    peers = _peers(rendered)
    policies = kinds(rendered, "NetworkPolicy")
    assert may_reach(policies, peers[source], peers[target], port) is allowed


def test_peoples_clients_reach_nats_where_the_values_say(helm: Helm) -> None:
    rendered = helm.render(
        sets={
            **REQUIRED_SETS,
            "networkPolicy.nats.clients[0].namespaceSelector.matchLabels.team": "vision",
        }
    )
    policies = kinds(rendered, "NetworkPolicy")
    nats = Peer("nats", "nats", {"app.kubernetes.io/name": "nats"})
    notebook = Peer("notebook", "notebooks", {"app": "jupyter"}, {"team": "vision"})
    assert may_reach(policies, notebook, nats, 4222)
    elsewhere = Peer("notebook", "notebooks", {"app": "jupyter"}, {"team": "nlp"})
    assert not may_reach(policies, elsewhere, nats, 4222)
    # The clients' rule opens NATS's client port, not its routes.
    assert not may_reach(policies, notebook, nats, 6222)


def test_the_policies_can_be_left_out(helm: Helm) -> None:
    rendered = helm.render(sets={**REQUIRED_SETS, "networkPolicy.enabled": "false"})
    assert kinds(rendered, "NetworkPolicy") == []
