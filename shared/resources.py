"""Ray custom resource names that pin work to capacity: the submitter asks for them,
the pool providers declare them on the nodes they start."""

from __future__ import annotations

from shared.events.types import CapacityClass

# A job asks for a sliver of its capacity's resource; a node declares plenty of it.
RESOURCE_PER_NODE = 1000.0
RESOURCE_PER_JOB = 0.001


def capacity_resource(capacity: CapacityClass) -> str | None:
    """The resource that keeps a job on spot or on-demand nodes; `any` runs on either."""
    if capacity is CapacityClass.ANY:
        return None
    return f"spotrain-capacity-{capacity.value}"


def pool_resource(pool: str) -> str:
    return f"spotrain-pool-{pool}"


# Ray node labels the providers set, so that any service can name a Ray node as the platform
# does (its pool's node name, which is the GKE node name on GKE).
NODE_LABEL = "spotrain-node"
POOL_LABEL = "spotrain-pool"
