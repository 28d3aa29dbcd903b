"""Where preemption signals come from: one port, a source per kind of notice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Collection
from typing import Protocol

from services.preemption_watcher.model import NodeSignal


class SignalSource(Protocol):
    """A stream of node signals from one place (GCE via Pub/Sub, Kubernetes, this machine).

    At least once: a signal is acknowledged at its source only when the consumer asks for
    the next one, that is after the consumer has published it; a crash in between means it
    is delivered again, with the same key.
    """

    @property
    def name(self) -> str: ...

    def signals(self, stop: asyncio.Event) -> AsyncGenerator[NodeSignal, None]:
        """Signals as they come, until `stop` is set. The consumer closes the generator
        (`aclose`) however it stops, so a source can hand back what it had pulled."""
        ...


class ShutdownGraces(Protocol):
    """The kubelet's shutdown grace periods each node pool is configured with (GKE's node
    system configuration). Synchronous (the Kubernetes source calls it from its watching
    thread); errors are `OSError`s."""

    def graces(self, node_pools: Collection[str]) -> dict[str, tuple[int, int]]:
        """Per node pool found: (shutdown grace, the part kept for critical pods), in
        seconds, 0 where the pool sets none; a pool that does not exist is left out."""
        ...
