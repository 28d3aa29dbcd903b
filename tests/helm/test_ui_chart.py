"""The web page in the chart: off by default; on, it runs with its own NATS role, takes the
person from the sign-in proxy's header, is reachable from that proxy only, and never reaches
Ray's job API."""

from __future__ import annotations

import pytest

from tests.helm.chart import REQUIRED_SETS, Helm, Manifest, env_of, kinds, named

pytestmark = pytest.mark.helm


def test_no_page_unless_asked(minimal: list[Manifest]) -> None:
    components = {
        m["metadata"].get("labels", {}).get("app.kubernetes.io/component") for m in minimal
    }
    assert "ui" not in components


def test_the_page_takes_the_person_from_the_sign_in_and_reads_with_its_own_role(
    with_ui: list[Manifest],
) -> None:
    deployment = named(with_ui, "Deployment", "spotrain-ui")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = env_of(container)

    assert container["command"] == ["python", "-m", "shared.ui"]
    assert env["SPOTRAIN_UI_VIEWER_HEADER"] == "X-Auth-Request-User"
    assert "SPOTRAIN_RAY_ADDRESS" not in env, "the page never reaches Ray's job API"
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    [creds] = [v for v in volumes if v["name"] == "nats-creds"]
    assert creds["secret"]["secretName"] == "spotrain-nats-ui"
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    service = named(with_ui, "Service", "spotrain-ui")
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "ui"


def test_only_the_sign_in_proxy_reaches_the_page(with_ui: list[Manifest]) -> None:
    policy = named(with_ui, "NetworkPolicy", "spotrain-ui")

    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "ui"
    [rule] = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"app": "oauth2-proxy"}}}]
    assert rule["ports"] == [{"port": 7460, "protocol": "TCP"}]
    # It reaches NATS as a platform process; Ray's job API admits it not.
    nats = named(with_ui, "NetworkPolicy", "spotrain-nats")
    platform = nats["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"][1]
    assert "ui" in platform["values"]
    ray = named(with_ui, "NetworkPolicy", "spotrain-ray")
    job_api = ray["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"][1]
    assert "ui" not in job_api["values"]


def test_a_page_without_its_sign_in_proxy_is_refused_with_one_line(helm: Helm) -> None:
    result = helm.template(sets={**REQUIRED_SETS, "ui.enabled": "true"})

    assert result.returncode != 0
    assert "ui.signInFrom is required when ui.enabled" in result.stderr


def test_the_page_has_a_service_account_of_its_own(with_ui: list[Manifest]) -> None:
    accounts = {a["metadata"]["name"] for a in kinds(with_ui, "ServiceAccount")}
    assert "spotrain-ui" in accounts
