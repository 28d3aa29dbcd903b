"""Value types the event contract is built from: ids, names, resource shapes.

They are constrained at the boundary so that nothing a publisher sends can carry a hostile
string or an absurd size deeper into the platform.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

JobId = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]
"""A job id: lowercase letters, digits and dashes; safe in NATS subjects, Ray ids, paths."""

Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")]
"""A user, experiment, pool or node name: no spaces, slashes or shell metacharacters."""

Label = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
SecretName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")]
"""A secret the platform holds (a file of its secrets folder, a key of a Kubernetes
Secret): a job names it, never carries its value."""
ShortText = Annotated[str, StringConstraints(max_length=1024)]
LongText = Annotated[str, StringConstraints(max_length=8192)]
Uri = Annotated[
    str, StringConstraints(min_length=1, max_length=2048, pattern=r"^[a-z][a-z0-9+.-]*://")
]

Attempt = Annotated[int, Field(ge=1, le=10_000)]
Step = Annotated[int, Field(ge=0)]


class CapacityClass(StrEnum):
    """Which capacity a job may run on: `any` means spot first, on-demand as fallback."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"
    ANY = "any"


class Frozen(BaseModel):
    """Base of every value on the bus: immutable, strict, no unknown fields."""

    # Schemas are built on first use, not at import: the CLI must start fast.
    model_config = ConfigDict(frozen=True, strict=True, extra="forbid", defer_build=True)


class Bundle(Frozen):
    """One worker's resource shape; a multi-node job asks for several, placed all or none."""

    gpus: Annotated[int, Field(ge=0, le=16)] = 0
    cpus: Annotated[float, Field(gt=0, le=512)] = 1.0
    memory_gb: Annotated[float, Field(ge=0, le=4096)] = 0.0
    gpu_type: Name | None = None


class ObjectRef(Frozen):
    """A blob in the bus's JetStream object store, e.g. a packed working directory."""

    bucket: Name
    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")]
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    size_bytes: Annotated[int, Field(ge=0)]
