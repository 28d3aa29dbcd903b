"""The scaler's settings, read from `SPOTRAIN_SCALER_*`."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from pydantic import AliasChoices, Field, TypeAdapter, model_validator
from pydantic_settings import SettingsConfigDict

from services.scaler.model import PoolSpec, ScalerConfig
from shared.runtime import RuntimeSettings


class ScalerSettings(RuntimeSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPOTRAIN_SCALER_", extra="ignore", frozen=True, populate_by_name=True
    )

    pools_file: Path | None = None
    """A TOML file of `[[pool]]` tables; the local default ships with the scaler."""
    budget_per_hour_usd: float = Field(50.0, ge=0)
    idle_timeout_s: float = Field(300.0, ge=0)
    learn_idle_timeout: bool = True
    """Each pool's idle timeout learnt from its idle periods, at most `idle_timeout_s`."""
    any_fallback_after_s: float = Field(600.0, ge=0)
    settle_s: float = Field(20.0, ge=0)
    capacity_retry_after_s: float = Field(300.0, ge=0)
    """How long a pool whose growth failed (no capacity) is left alone."""
    reconcile_interval_s: float = Field(2.0, gt=0)
    cost_meter_interval_s: float = Field(10.0, gt=0)
    """The pause between two attributions of the cost-accrued metrics (each attributes all
    history, off the event loop: ~0.27 s per thousand jobs the first time, a quarter of that
    after, since nodes that ended are remembered; bench/cost_meter.py)."""
    provider: str = Field("local", pattern="^(local|gke|kuberay)$")
    gke_project: str | None = None
    gke_location: str | None = None
    """The cluster's region (regional cluster) or zone (zonal cluster)."""
    gke_cluster: str | None = None
    gke_node_pools: dict[str, str] = Field(default_factory=dict)
    """Spotrain pool name → GKE node pool name, as JSON in the environment."""
    gke_api_endpoint: str | None = None
    """Another GKE API endpoint (a local fake); an `http://` one is called without credentials."""
    gke_compute_api_endpoint: str | None = None
    """Another Compute API endpoint (a local fake), for the node pools' instance groups and
    the VMs' end records; likewise."""
    capacity_advice: bool | None = None
    """Read the cloud's capacity advice for the spot pools where the provider gives one:
    an obtainability and an estimated uptime, blended into the deadline policy and the
    pools' risk. Unset: on with gke (Compute Engine's), off with local, whose market trace's
    advice is exact, an oracle no cloud gives (set it true to see what one would do)."""

    def reads_advice(self) -> bool:
        if self.capacity_advice is not None:
            return self.capacity_advice
        return self.provider == "gke"

    kuberay_cluster: str | None = None
    """The RayCluster whose worker groups are the pools (the kuberay provider)."""
    kuberay_namespace: str | None = None
    """The RayCluster's namespace, where its worker pods run too."""
    kuberay_api_endpoint: str | None = None
    """Another Kubernetes API server (a local fake), called as is, without credentials;
    else the cluster this runs in, else ~/.kube/config."""
    ray_gcs_address: str = Field(
        "127.0.0.1:6380",
        validation_alias=AliasChoices(
            "SPOTRAIN_SCALER_RAY_GCS_ADDRESS", "SPOTRAIN_RAY_GCS_ADDRESS"
        ),
    )
    local_home: Path = Field(
        default_factory=lambda: Path.home() / ".spotrain",
        validation_alias=AliasChoices("SPOTRAIN_SCALER_LOCAL_HOME", "SPOTRAIN_LOCAL_HOME"),
    )

    @model_validator(mode="after")
    def _provider_is_complete(self) -> ScalerSettings:
        needs = {
            "gke": ("gke_project", "gke_location", "gke_cluster", "gke_node_pools"),
            "kuberay": ("kuberay_cluster", "kuberay_namespace"),
        }
        missing = [
            f"SPOTRAIN_SCALER_{name.upper()}"
            for name in needs.get(self.provider, ())
            if not getattr(self, name)
        ]
        if missing:
            msg = f"the {self.provider} provider needs {', '.join(missing)}"
            raise ValueError(msg)
        return self

    def pools(self) -> list[PoolSpec]:
        if self.pools_file is None:
            text = resources.files("services.scaler").joinpath("pools.local.toml").read_text()
        else:
            text = self.pools_file.read_text()
        return TypeAdapter(list[PoolSpec]).validate_python(
            tomllib.loads(text).get("pool", []), strict=False
        )

    def policy_config(self) -> ScalerConfig:
        return ScalerConfig(
            budget_per_hour_usd=self.budget_per_hour_usd,
            idle_timeout_s=self.idle_timeout_s,
            learn_idle_timeout=self.learn_idle_timeout,
            any_fallback_after_s=self.any_fallback_after_s,
            settle_s=self.settle_s,
            capacity_retry_after_s=self.capacity_retry_after_s,
            pass_interval_s=self.reconcile_interval_s,
        )
