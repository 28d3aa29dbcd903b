"""The preemption_watcher's settings, read from `SPOTRAIN_PREEMPTION_WATCHER_*`."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import SettingsConfigDict

from shared.runtime import RuntimeSettings


class SourceName(StrEnum):
    LOCAL = "local"
    GCE_PUBSUB = "gce-pubsub"
    K8S = "k8s"


class PreemptionWatcherSettings(RuntimeSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPOTRAIN_PREEMPTION_WATCHER_",
        extra="ignore",
        frozen=True,
        populate_by_name=True,
    )

    sources: tuple[SourceName, ...] = (SourceName.LOCAL,)
    """Which sources to watch, as JSON in the environment: `["gce-pubsub", "k8s"]` on GKE.
    (The `metadata` source is an agent on each node, not part of this service.)"""
    local_home: Path = Field(
        default_factory=lambda: Path.home() / ".spotrain",
        validation_alias=AliasChoices(
            "SPOTRAIN_PREEMPTION_WATCHER_LOCAL_HOME", "SPOTRAIN_LOCAL_HOME"
        ),
    )
    local_poll_interval_s: float = Field(0.1, gt=0)
    pubsub_subscription: str | None = Field(None, pattern=r"^projects/[^/]+/subscriptions/[^/]+$")
    """`projects/P/subscriptions/S`, fed by a Cloud Logging sink of preemption entries."""
    pubsub_endpoint: str | None = None
    """Another Pub/Sub endpoint (`host:port` of a local fake or the emulator), no credentials."""
    pubsub_notice_s: float = Field(30.0, gt=0)
    """How long GCE gives a preempted Spot VM after the log entry's time."""
    k8s_pool_label: str = "cloud.google.com/gke-nodepool"
    """The Node label that names its pool."""
    k8s_kubeconfig: Path | None = None
    """Outside a cluster: the kubeconfig to use; inside one, its service account is."""
    k8s_watch_timeout_s: int = Field(300, gt=0)
    k8s_gke_cluster: str | None = Field(
        None, pattern=r"^projects/[^/]+/locations/[^/]+/clusters/[^/]+$"
    )
    """On GKE, `projects/P/locations/L/clusters/C`: each node pool's notice is read from its
    kubelet shutdown grace (up to 120 s for Spot node pools); else every Spot node's is
    GKE's default, 15 s."""
    gke_api_endpoint: str | None = None
    """Another GKE API endpoint (a local fake), with no credentials."""

    @model_validator(mode="after")
    def _sources_are_configured(self) -> PreemptionWatcherSettings:
        if SourceName.GCE_PUBSUB in self.sources and self.pubsub_subscription is None:
            msg = "the gce-pubsub source needs SPOTRAIN_PREEMPTION_WATCHER_PUBSUB_SUBSCRIPTION"
            raise ValueError(msg)
        return self
