"""The chart rendered once per module for each configuration the tests look at."""

from __future__ import annotations

import pytest

from tests.helm.chart import (
    GKE_EXAMPLE,
    REQUIRED_SETS,
    Helm,
    HelmUnavailableError,
    Manifest,
    find_helm,
)


@pytest.fixture(scope="session")
def helm() -> Helm:
    try:
        return Helm(find_helm())
    except HelmUnavailableError as error:
        pytest.skip(f"helm is not installed and could not be installed: {error}")


@pytest.fixture(scope="session")
def minimal(helm: Helm) -> list[Manifest]:
    """The default values, given only what the chart requires."""
    return helm.render()


@pytest.fixture(scope="session")
def gke(helm: Helm) -> list[Manifest]:
    """The production example of docs/deploy-gke.md."""
    return helm.render(values=[GKE_EXAMPLE], sets={})


@pytest.fixture(scope="session")
def kuberay(helm: Helm) -> list[Manifest]:
    """The default values with the scaler's kuberay provider."""
    return helm.render(sets={**REQUIRED_SETS, "scaler.settings.provider": "kuberay"})


@pytest.fixture(scope="session")
def with_ui(helm: Helm) -> list[Manifest]:
    """The default values with the web page behind a sign-in proxy."""
    return helm.render(
        sets={
            **REQUIRED_SETS,
            "ui.enabled": "true",
            "ui.signInFrom[0].podSelector.matchLabels.app": "oauth2-proxy",
        }
    )
