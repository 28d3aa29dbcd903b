"""The attacks that were tried on the secure stack (issue 32), each as a probe that reports
whether it got through. `tests/security/` asserts none does; `bench/security.py` counts
them per class. A new route found by a probe belongs here.

An arena is a secure local stack with two people in two teams: alice (vision), the
attacker, and bob (nlp), whose job and team secret are the victims; and ops, to look at
what the bus stored."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import socket
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared.client import PlatformError, SpotrainClient
from shared.clock import SystemClock
from shared.desk import Ask, DeskAsk, UploadPart, desk_subject
from shared.events import encode, new_event
from shared.events.data import JobCancelRequested, JobRequested
from shared.events.types import CapacityClass
from shared.jobs import JobState
from shared.messaging import BusSettings
from shared.messaging.jetstream import BusPermissionError, JetStreamBus

PREFIX = "spotrain"
STREAM = "SPOTRAIN"
API = "$JS.API"
BOBS_SUBJECT = f"{PREFIX}.job.requested.bob"


def load_env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip().strip("'\"") for key, value in pairs}


def bus_settings(env: dict[str, str], nats_url: str) -> BusSettings:
    fields = {k.removeprefix("SPOTRAIN_").lower(): v for k, v in env.items()}
    timeouts = {"connect_timeout_s": 10, "publish_timeout_s": 10, "ack_wait_s": 5}
    return BusSettings.model_validate({**fields, "nats_url": nats_url, **timeouts})


@dataclass
class Arena:
    """A secure stack with its people connected; `victim_job` runs (or waits) as bob's."""

    home: Path
    stack_env: dict[str, str]
    alice: JetStreamBus
    bob: JetStreamBus
    ops: JetStreamBus
    dashboard: str
    agent_port: int
    victim_job: str

    def client(self, bus: JetStreamBus, person: str) -> SpotrainClient:
        return SpotrainClient(bus, SystemClock(), person=person)

    async def stored(self, subject: str) -> int:
        return len(await self.ops.read(subject))

    async def bobs_requests(self) -> int:
        return await self.stored(f"{PREFIX}.job.requested.bob") + await self.stored(
            f"{PREFIX}.job.cancel_requested.bob"
        )


Probe = Callable[[Arena], Awaitable[bool]]


@dataclass(frozen=True)
class Attack:
    name: str
    kind: str
    """Its class, as the issue counts them."""
    run: Callable[[Arena], Awaitable[bool]]
    """True when it got through."""


async def refused(bus: JetStreamBus, subject: str, payload: bytes = b"{}", reply: str = "") -> bool:
    """Whether the server refuses `bus` publishing on `subject` (it says so at once)."""
    try:
        async with bus.permission_checked("probe", subject=subject):
            await bus.client.publish(subject, payload, reply=reply)
            await bus.client.flush()
            await asyncio.sleep(0.3)
    except BusPermissionError:
        return True
    return False


def _through_unless_refused(subject: str, payload: bytes = b"{}") -> Probe:
    async def run(arena: Arena) -> bool:
        return not await refused(arena.alice, subject, payload)

    return run


def _listens(subject: str) -> Probe:
    async def run(arena: Arena) -> bool:
        try:
            async with arena.alice.permission_checked(f"listen to {subject}"):
                await arena.alice.client.subscribe(subject)
                await arena.alice.client.flush()
                await asyncio.sleep(0.5)
        except BusPermissionError:
            return False
        return True

    return run


def _into_bobs_subject(subject: str, payload: bytes) -> Probe:
    """Ask the server for something, its answer addressed to bob's request subject: if the
    server sent it there, it would be stored as bob's request."""

    async def run(arena: Arena) -> bool:
        before = await arena.bobs_requests()
        was_refused = await refused(
            arena.alice, subject, payload, reply=f"{PREFIX}.job.requested.bob"
        )
        await asyncio.sleep(0.5)
        return not was_refused or await arena.bobs_requests() > before

    return run


async def _desk_answer_into_bobs_subject(arena: Arena) -> bool:
    before = await arena.bobs_requests()
    ask = DeskAsk(ask=Ask.JOBS).model_dump_json().encode()
    for reply in (f"{PREFIX}.job.requested.bob", f"{PREFIX}.job.cancel_requested.bob"):
        await arena.alice.client.publish(desk_subject(PREFIX, "alice"), ask, reply=reply)
    await arena.alice.client.flush()
    await asyncio.sleep(1)
    return await arena.bobs_requests() > before


async def _submit_as_bob(arena: Arena) -> bool:
    before = await arena.bobs_requests()
    request = JobRequested(job_id="forged-1", owner="bob", entrypoint=("python", "x.py"))
    event = new_event(request, source="cli/bob", time=datetime.now(UTC), subject="forged-1")
    with contextlib.suppress(PlatformError):
        await arena.client(arena.alice, "alice")._ask(
            DeskAsk(ask=Ask.SUBMIT, event=encode(event).decode())
        )
    return await arena.bobs_requests() > before


async def _cancel_bobs_job(arena: Arena) -> bool:
    alice = arena.client(arena.alice, "alice")
    for requested_by in ("bob", "alice"):
        cancel = JobCancelRequested(job_id=arena.victim_job, requested_by=requested_by)
        event = new_event(cancel, source="cli/alice", time=datetime.now(UTC))
        with contextlib.suppress(PlatformError):
            await alice._ask(DeskAsk(ask=Ask.SUBMIT, event=encode(event).decode()))
    await asyncio.sleep(3)  # the submitter's intake decides in well under that
    record = await arena.client(arena.bob, "bob").job(arena.victim_job)
    return record is None or record.cancel_requested or record.state is JobState.CANCELLED


async def _claim_anothers_event_id(arena: Arena) -> bool:
    """Alice's request under the id the submitter gives bob's next job's acceptance: the
    stream's de-duplication would drop that acceptance, were the id hers to take."""
    job_id = f"victim-ids-{int(time.time())}"
    own = JobRequested(job_id="alice-ids", owner="alice", entrypoint=("python", "x.py"))
    alice = arena.client(arena.alice, "alice")
    for event_id in (f"accepted-{job_id}", f"queued-{job_id}-1"):
        event = new_event(own, source="cli/alice", time=datetime.now(UTC), event_id=event_id)
        with contextlib.suppress(PlatformError):
            await alice._ask(DeskAsk(ask=Ask.SUBMIT, event=encode(event).decode()))
    bob = arena.client(arena.bob, "bob")
    victim = JobRequested(
        job_id=job_id,
        owner="bob",
        entrypoint=("python", "-c", "pass"),
        capacity=CapacityClass.ON_DEMAND,
    )
    answer = await bob.submit(victim, answer_timeout_s=15)
    events = [type(e.data).__name__ for e in await bob.history(job_id)]
    await bob.cancel(job_id, "bob")
    return answer is None or "JobAccepted" not in events


async def _read_bobs_job(arena: Arena) -> bool:
    alice = arena.client(arena.alice, "alice")
    found = await alice.job(arena.victim_job)
    history = await alice.history(arena.victim_job)
    return found is not None or bool(history)


def zip_bomb_part() -> UploadPart:
    """A workspace of one part (under 200 KiB) that unpacks to 120 MiB, past the limit."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for i in range(2):
            archive.writestr(f"zeros-{i}.bin", bytes(60 * 1024**2))
    bomb = buffer.getvalue()
    return UploadPart(
        sha256=hashlib.sha256(bomb).hexdigest(),
        size=len(bomb),
        offset=0,
        data=base64.b64encode(bomb).decode(),
    )


async def _zip_bomb(arena: Arena) -> bool:
    ask = DeskAsk(ask=Ask.UPLOAD, part=zip_bomb_part())
    try:
        answer = await arena.client(arena.alice, "alice")._ask(ask)
    except PlatformError:
        return False
    return answer.workspace is not None


async def _anothers_team_secret(arena: Arena) -> bool:
    alice = arena.client(arena.alice, "alice")
    request = JobRequested(
        job_id=f"alice-secret-{int(time.time())}",
        owner="alice",
        entrypoint=("python", "-c", "pass"),
        secrets={"HF_TOKEN": "hf-token"},  # nlp's: bob's team's
    )
    answer = await alice.submit(request, answer_timeout_s=15)
    if answer is not None and type(answer.data).__name__ == "JobAccepted":
        await alice.cancel(request.job_id, "alice")
        return True
    return answer is None


def _http(url: str, data: bytes | None = None) -> int:
    request = urllib.request.Request(  # noqa: S310  # the stack's own Ray
        url, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return 0


def _ray_api(path: str, data: dict[str, Any] | None = None) -> Probe:
    async def run(arena: Arena) -> bool:
        body = json.dumps(data).encode() if data is not None else None
        code = await asyncio.to_thread(_http, f"{arena.dashboard}{path}", body)
        return 200 <= code < 300

    return run


async def _ray_agent_beyond_loopback(arena: Arena) -> bool:
    """The dashboard agent listens on the host's address too: it must ask for the token."""
    address = socket.gethostbyname(socket.gethostname())
    url = f"http://{address}:{arena.agent_port}/api/job_agent/jobs/"
    code = await asyncio.to_thread(_http, url, b'{"entrypoint": "echo pwned"}')
    return 200 <= code < 300


ATTACKS: tuple[Attack, ...] = (
    # 1: the server answering, with its rights, on a reply subject the person chose.
    Attack(
        "direct-get-into-bobs-subject",
        "reply_route",
        _into_bobs_subject(
            f"{API}.DIRECT.GET.OBJ_{PREFIX}-workspaces",
            json.dumps({"last_by_subj": f"$O.{PREFIX}-workspaces.C.x"}).encode(),
        ),
    ),
    Attack(
        "consumer-delivery-into-bobs-subject",
        "reply_route",
        _into_bobs_subject(
            f"{API}.CONSUMER.CREATE.{STREAM}",
            json.dumps(
                {
                    "stream_name": STREAM,
                    "config": {"deliver_subject": f"{PREFIX}.job.requested.bob"},
                }
            ).encode(),
        ),
    ),
    Attack(
        "publish-ack-into-bobs-subject",
        "reply_route",
        _into_bobs_subject(f"{PREFIX}.job.requested.alice", b"{}"),
    ),
    Attack("desk-answer-into-bobs-subject", "reply_route", _desk_answer_into_bobs_subject),
    Attack("desk-submit-as-bob", "reply_route", _submit_as_bob),
    Attack("cancel-bobs-job", "reply_route", _cancel_bobs_job),
    # 2: Ray's job API without its token.
    Attack(
        "ray-job-submit-without-token",
        "ray_api",
        _ray_api("/api/jobs/", {"entrypoint": "echo pwned"}),
    ),
    Attack("ray-job-list-without-token", "ray_api", _ray_api("/api/jobs/")),
    Attack("ray-agent-beyond-loopback", "ray_api", _ray_agent_beyond_loopback),
    # 3: declaring a stream of one's own (the workspaces store, with others as sources).
    Attack(
        "create-the-workspaces-stream",
        "stream_create",
        _through_unless_refused(f"{API}.STREAM.CREATE.OBJ_{PREFIX}-workspaces"),
    ),
    Attack(
        "create-a-stream-sourcing-the-jobs",
        "stream_create",
        _through_unless_refused(
            f"{API}.STREAM.CREATE.mirror",
            json.dumps({"name": "mirror", "sources": [{"name": f"KV_{PREFIX}-jobs"}]}).encode(),
        ),
    ),
    # 5: another team's secret.
    Attack("anothers-team-secret", "secrets", _anothers_team_secret),
    # 6: the services' consumers.
    Attack(
        "pull-from-the-submitters-consumer",
        "consumers",
        _through_unless_refused(f"{API}.CONSUMER.MSG.NEXT.{STREAM}.submitter"),
    ),
    Attack(
        "delete-the-submitters-consumer",
        "consumers",
        _through_unless_refused(f"{API}.CONSUMER.DELETE.{STREAM}.submitter"),
    ),
    # 7: the workspace store.
    Attack(
        "list-the-workspaces",
        "workspace_store",
        _through_unless_refused(f"{API}.CONSUMER.CREATE.OBJ_{PREFIX}-workspaces"),
    ),
    Attack(
        "overwrite-a-workspaces-metadata",
        "workspace_store",
        _through_unless_refused(f"$O.{PREFIX}-workspaces.M.eA"),
    ),
    Attack(
        "wipe-the-store-with-a-rollup",
        "workspace_store",
        _through_unless_refused(f"$O.{PREFIX}-workspaces.M.all"),
    ),
    # 8: another's event ids.
    Attack("claim-anothers-event-ids", "event_ids", _claim_anothers_event_id),
    # Reading another team's jobs and the buckets behind them.
    Attack("read-bobs-job-through-the-desk", "reads", _read_bobs_job),
    Attack(
        "read-the-jobs-bucket",
        "reads",
        _through_unless_refused(f"{API}.DIRECT.GET.KV_{PREFIX}-jobs"),
    ),
    Attack("list-the-streams", "reads", _through_unless_refused(f"{API}.STREAM.NAMES")),
    Attack("tail-the-job-events", "reads", _listens(f"{PREFIX}.job.>")),
    # 10: a zip bomb.
    Attack("zip-bomb", "zip_bomb", _zip_bomb),
)
