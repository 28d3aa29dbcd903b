"""The notice in the chart (issue 36, 4): each Ray worker pod of a pool holds Ray up for the
notice its node pool gives (GKE's 15 s by default, 105 s with the 120 s shutdown grace), so
the checkpoint asked for on the notice is written before the raylet stops; the watcher
reads each node pool's grace from GKE."""

from __future__ import annotations

import pytest

from tests.helm.chart import REQUIRED_SETS, Helm, Manifest, env_of, kinds

pytestmark = pytest.mark.helm


def _groups(manifests: list[Manifest]) -> dict[str, Manifest]:
    [cluster] = kinds(manifests, "RayCluster")
    return {g["groupName"]: g["template"]["spec"] for g in cluster["spec"]["workerGroupSpecs"]}


@pytest.mark.parametrize(("notice", "wait"), [(None, "13"), ("105", "103")])
def test_each_pools_ray_pod_waits_out_the_notice_before_ray_stops(
    helm: Helm, notice: str | None, wait: str
) -> None:
    sets = {**REQUIRED_SETS, **({"ray.workerNoticeS": notice} if notice else {})}
    groups = _groups(helm.render(sets=sets))
    pools = {name: spec for name, spec in groups.items() if name != "drivers"}
    assert pools
    for spec in pools.values():
        assert spec["terminationGracePeriodSeconds"] == int(notice or 15)
        (worker,) = spec["containers"]
        assert worker["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", wait]
    for name, spec in groups.items():
        if name == "drivers":
            (driver,) = spec["containers"]
            assert "lifecycle" not in driver, "a driver coordinates: nothing to checkpoint"


def test_a_notice_past_gkes_longest_grace_is_refused(helm: Helm) -> None:
    result = helm.run("template", "spotrain", "--set", "ray.workerNoticeS=600", *_sets())
    assert result.returncode != 0
    assert "workerNoticeS" in result.stderr


def test_the_watcher_reads_each_node_pools_grace_from_the_cluster(
    minimal: list[Manifest],
) -> None:
    [watcher] = [
        d for d in kinds(minimal, "Deployment") if d["metadata"]["name"].endswith("watcher")
    ]
    (container,) = watcher["spec"]["template"]["spec"]["containers"]
    assert env_of(container)["SPOTRAIN_PREEMPTION_WATCHER_K8S_GKE_CLUSTER"] == (
        "projects/acme-ml/locations/us-central1/clusters/training"
    )


def _sets() -> list[str]:
    return [arg for key, value in REQUIRED_SETS.items() for arg in ("--set", f"{key}={value}")]
