"""Who may do what to a job, pure: cancel it (its owner, its team's admins), read its
record and events (its owner and team). The submitter decides with these (its records
desk answers people with what they may read); the web page shows with them."""

from __future__ import annotations

from shared.jobs import JobRecord
from shared.policy.teams import Teams


def who_may_not_cancel(
    record: JobRecord, requested_by: str, teams: Teams | None = None
) -> str | None:
    """Why `requested_by` may not cancel this job, if they may not: a job is its owner's
    to cancel, and its team admins'. `requested_by` is proven, as the owner was: each is
    the name of the credential that sent the request (`shared.events.catalog.SENT_BY`)."""
    if requested_by == record.request.owner:
        return None
    team = teams.team_of(record.request.owner) if teams is not None else None
    if team is not None and requested_by in team.admins:
        return None
    admins = f" or an admin of team {team.name}" if team is not None else ""
    owner = record.request.owner
    return f"{requested_by} may not cancel {record.job_id}: only {owner}{admins} may"


def may_read(record: JobRecord, reader: str, teams: Teams | None = None) -> bool:
    """Whether `reader` (proven, as the desk's asker is) may read this job's record and
    events, `--env` values included: their own jobs and their team's. The team is the one
    the job was admitted under, else the owner's today."""
    if reader == record.request.owner:
        return True
    if teams is None:
        return False
    readers_team = teams.team_of(reader)
    if readers_team is None:
        return False
    owners_team = record.team
    if owners_team is None:
        found = teams.team_of(record.request.owner)
        owners_team = found.name if found is not None else None
    return owners_team == readers_team.name
