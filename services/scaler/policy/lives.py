"""A node is one life of a machine, pure: no I/O, no clock.

A cloud can make a machine again under its name (a managed instance group recreating a
preempted or deleted VM, as GKE's node pools do): to Ray, Kubernetes and the attempts it
is the same name, to the bill and to the market another machine. The scaler closes the
life before, opens the next under a name of its own in the ledger (`ledger_name`), and
lets a job that lost the name run on its next life (`avoided`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime

from services.scaler.model import Demand
from shared.events.data import ReleaseReason


def new_life(billed: str | None, listed: str | None, *, recreating: bool) -> bool:
    """Whether the machine now listed under a name is another than the one billed: the
    provider is making it again, or it names another machine. A life not known on either
    side (a VM not made yet, a provider that never reuses names) is the same one."""
    if billed is None:
        return False
    return recreating or (listed is not None and listed != billed)


def gone_reason(*, maintenance: bool, unwatched: bool) -> ReleaseReason:
    """Why a node ended that the scaler did not release: it stopped while no scaler
    watched; the provider replaced or recreated it in an upgrade or repair of its pool; or
    else it went unasked, which alone counts as the market taking it back."""
    if unwatched:
        return ReleaseReason.GONE_WHILE_UNWATCHED
    if maintenance:
        return ReleaseReason.MAINTENANCE
    return ReleaseReason.GONE


def ledger_name(machine: str, launched_at: datetime, taken: Collection[str]) -> str:
    """The ledger's name for a life of `machine` launched then: the machine's own for its
    first, `<machine>@<launch second>` for each later one (with `-2`, `-3`... should two
    begin in the same second), so no two lives share an entry."""
    if machine not in taken:
        return machine
    base = f"{machine}@{int(launched_at.timestamp())}"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    return name


def avoided(demand: Demand, launched: Mapping[str, datetime]) -> Demand:
    """The demand with only the nodes it must still avoid. It avoids the names its job
    lost; a name whose machine was launched after the demand was queued (a VM recreated
    under it since) is another machine, healthy, and no longer avoided. A name launched
    before is kept avoided, even where it may be a new machine: the job then waits for
    another node rather than risk the one it lost."""
    kept = tuple(
        name
        for name in demand.avoid_nodes
        if name not in launched or launched[name] <= demand.queued_at
    )
    if kept == demand.avoid_nodes:
        return demand
    return demand.model_copy(update={"avoid_nodes": kept})


def every_avoided(demands: Sequence[Demand], launched: Mapping[str, datetime]) -> list[Demand]:
    return [avoided(demand, launched) for demand in demands]
