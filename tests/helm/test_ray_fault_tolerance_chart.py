"""Ray's GCS fault tolerance in the chart: off by default; on, the RayCluster keeps the
head's state in the given Redis, and a pre-install check refuses a Redis that does not
answer with the password, before KubeRay could start a head without it."""

from __future__ import annotations

import pytest

from tests.helm.chart import REQUIRED_SETS, Helm, Manifest, env_of, kinds, named

pytestmark = pytest.mark.helm

FT = {
    **REQUIRED_SETS,
    "ray.faultTolerance.enabled": "true",
    "ray.faultTolerance.redisAddress": "redis.spotrain.svc:6379",
    "ray.faultTolerance.passwordSecret": "spotrain-ray-redis",
}


def test_no_fault_tolerance_unless_asked(minimal: list[Manifest]) -> None:
    [cluster] = kinds(minimal, "RayCluster")
    assert "gcsFaultToleranceOptions" not in cluster["spec"]
    assert not [m for m in kinds(minimal, "Job") if m["metadata"]["name"].endswith("redis-check")]


def test_the_head_keeps_its_state_in_the_redis_and_the_install_checks_it(helm: Helm) -> None:
    manifests = helm.render(sets=FT)
    [cluster] = kinds(manifests, "RayCluster")
    assert cluster["spec"]["gcsFaultToleranceOptions"] == {
        "redisAddress": "redis.spotrain.svc:6379",
        "redisPassword": {
            "valueFrom": {"secretKeyRef": {"name": "spotrain-ray-redis", "key": "password"}}
        },
        "externalStorageNamespace": "spotrain",
    }
    check = named(manifests, "Job", "spotrain-ray-redis-check")
    assert check["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    (container,) = check["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "shared.ray_head", "check-redis"]
    env = env_of(container)
    assert env["SPOTRAIN_RAY_REDIS_ADDRESS"] == "redis.spotrain.svc:6379"
    assert env["SPOTRAIN_RAY_REDIS_PASSWORD"] == {
        "secretKeyRef": {"name": "spotrain-ray-redis", "key": "password"}
    }


@pytest.mark.parametrize(
    ("sets", "said"),
    [
        pytest.param(
            {"ray.faultTolerance.redisAddress": ""},
            "ray.faultTolerance.enabled needs ray.faultTolerance.redisAddress",
            id="no-address",
        ),
        pytest.param({"ray.faultTolerance.redisAddress": "redis"}, "redisAddress", id="no-port"),
    ],
)
def test_fault_tolerance_without_a_redis_is_refused(
    helm: Helm, sets: dict[str, str], said: str
) -> None:
    result = helm.template(sets={**FT, **sets})
    assert result.returncode != 0
    assert said in result.stderr
