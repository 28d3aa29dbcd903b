"""The watcher's decisions, pure: no I/O, no clock (`now` is an argument).

- `pod_notice_s`: what a training pod has of its node's end, from the node pool's kubelet
  shutdown grace periods (GKE's node system configuration);
- `node_deadline`: when a node's VM goes, by the earliest sign a Kubernetes Node shows;
- `notice_key`: which of the metadata server's answers are the same notice;
- `Backoff`: how long the metadata agent waits after failures in a row.

The payload readers (`payloads/`) turn the cloud's and Kubernetes' JSON into the values
these take; the adapters only fetch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

GKE_SPOT_NOTICE_S = 15.0
"""What a training pod has of a Spot VM's end on GKE by default: the kubelet's graceful
shutdown gives non-system pods the first 15 s of the VM's 30."""
LONGEST_SHUTDOWN_GRACE_S = 120
"""The longest shutdown grace GKE lets a Spot node pool set (GKE 1.35.0-gke.1171000 and
later, or through a ComputeClass)."""


def pod_notice_s(shutdown_grace_s: int, critical_pods_s: int, default_s: float) -> float:
    """The notice a non-system pod has: the kubelet's shutdown grace less the part kept for
    critical pods, which shut down last. A node pool that sets no grace (0) has GKE's
    default, `default_s`; a grace past what GKE allows is taken at that bound, and a
    critical share past the grace leaves pods nothing."""
    if shutdown_grace_s <= 0:
        return default_s
    grace = min(shutdown_grace_s, LONGEST_SHUTDOWN_GRACE_S)
    return float(max(grace - max(critical_pods_s, 0), 0))


@dataclass(frozen=True)
class NoticeRules:
    """How long each notice lasts."""

    notice_s: float = GKE_SPOT_NOTICE_S
    """A training pod's share of a Spot or preemptible VM's end, where its node pool's is
    not known."""
    pool_notice_s: Mapping[str, float] = field(default_factory=dict)
    """The share on each node pool whose shutdown grace was read (`pod_notice_s`)."""
    maintenance_notice_s: float = 3600.0
    """How long before a scheduled host maintenance it is a notice (and an on-demand VM's
    notice under the old termination handler's taint)."""

    def notice_on(self, pool: str | None) -> float:
        if pool is None:
            return self.notice_s
        return self.pool_notice_s.get(pool, self.notice_s)


def node_deadline(
    *,
    now: datetime,
    pool: str | None,
    is_spot: bool,
    termination_taint_at: datetime | None,
    tainted: bool,
    maintenance_at: datetime | None,
    shutting_down_since: datetime | None,
    shutting_down: bool,
    rules: NoticeRules,
) -> datetime | None:
    """When the node's VM goes, by the earliest sign that it will; None if there is none.

    - the old termination handler's taint (`tainted`, from `termination_taint_at`, else
      from now: it writes no time): a Spot VM's notice, or an hour for host maintenance;
    - a scheduled host maintenance, once it is `maintenance_notice_s` away;
    - the kubelet's graceful shutdown (`shutting_down`, since its `Ready=False`): the
      node pool's notice. A node the cluster autoscaler removes also shuts down: the
      caller says `shutting_down` only for one it does not.
    """
    deadlines = []
    if tainted:
        notice_s = rules.notice_on(pool) if is_spot else rules.maintenance_notice_s
        deadlines.append((termination_taint_at or now) + timedelta(seconds=notice_s))
    if maintenance_at is not None and (maintenance_at - now).total_seconds() <= (
        rules.maintenance_notice_s
    ):
        deadlines.append(maintenance_at)
    if shutting_down:
        since = shutting_down_since or now
        deadlines.append(since + timedelta(seconds=rules.notice_on(pool)))
    return min(deadlines, default=None)


def notice_key(node: str, etag: str | None, seen_at: datetime) -> str:
    """The notice's key: the TRUE value's ETag repeats after a restart, the time not. Pure."""
    return f"{node}@{etag}" if etag is not None else f"{node}@{seen_at.isoformat()}"


@dataclass(frozen=True)
class Backoff:
    """Pauses between failed requests. No jitter: each agent asks only its own VM's server."""

    first_s: float = 0.5
    cap_s: float = 30.0

    def delay_s(self, failures: int) -> float:
        """The pause after `failures` failures in a row (at least 1): doubling, capped. Pure."""
        return min(self.cap_s, self.first_s * 2.0 ** min(max(failures, 1) - 1, 64))
