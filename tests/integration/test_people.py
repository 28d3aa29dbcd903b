"""People with credentials of their own (`spotrain users add`), against a real nats-server
started with the generated configuration: a person's requests are theirs, proven by the
subject the server lets them publish on, and nobody can send one as someone else."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import nats.js.errors
import pytest

from services.submitter.adapters.kv_job_store import KvJobStore
from services.submitter.adapters.records_desk import RecordsDesk
from shared.client import DeskRefusedError, PlatformError, SpotrainClient, current_user
from shared.clock import SystemClock
from shared.desk import (
    DESK,
    HIDDEN_OWNER,
    MOST_ASKS_PER_PERSON,
    MOST_STAGED_BYTES,
    PART_BYTES,
    REQUESTS_BURST,
    REQUESTS_PER_S,
    Ask,
    DeskAsk,
    UploadPart,
    alias,
    desk_subject,
)
from shared.events import EventData, decode, dlq_subject, encode, new_event
from shared.events.data import (
    InterruptionCause,
    JobAccepted,
    JobCancelled,
    JobCancelRequested,
    JobRequested,
)
from shared.jobs import Attempt, AttemptState, JobRecord, JobState, jobs_bucket
from shared.localstack.nats_server import NatsServer
from shared.messaging import BusSettings
from shared.messaging.jetstream import BusPermissionError, JetStreamBus
from shared.messaging.settings import ClientBusSettings
from shared.natsauth import Role, write_nats_config
from shared.natsauth.files import add_person, person_env, write_env_file
from shared.policy.teams import Teams, parse_teams
from shared.workspace import DEFAULT_LIMIT_BYTES, declare_stores
from tests.async_helpers import eventually
from tests.events import NOW, job_requested
from tests.fakes.submitter import FakeProgress, FakeRay
from tests.security.attacks import zip_bomb_part

pytestmark = pytest.mark.integration

PREFIX = "spotrain"
TIMEOUTS = {"connect_timeout_s": 10, "publish_timeout_s": 10, "ack_wait_s": 5}


class People:
    """A server that knows alice and jane.doe (vision, its admin) and bob (nlp), and buses
    that connect as them."""

    def __init__(self, auth: Path, url: str, stack: AsyncExitStack) -> None:
        self.auth = auth
        self.url = url
        self.stack = stack
        self.envs: dict[str, dict[str, str]] = {}

    def settings(self, name: str) -> BusSettings:
        fields = {k.removeprefix("SPOTRAIN_").lower(): v for k, v in self.envs[name].items()}
        return BusSettings.model_validate({**fields, "nats_url": self.url, **TIMEOUTS})

    async def bus(self, name: str) -> JetStreamBus:
        bus = await JetStreamBus.connect(self.settings(name), name=name)
        self.stack.push_async_callback(bus.close)
        return bus


@pytest.fixture
async def people(tmp_path: Path) -> AsyncIterator[People]:
    auth = tmp_path / "auth"
    write_nats_config(auth, prefix=PREFIX)
    persons = {
        "alice": add_person(auth, "alice", team="vision"),
        "jane.doe": add_person(auth, "jane.doe", team="vision", admin=True),
        "bob": add_person(auth, "bob", team="nlp"),
    }
    config = write_nats_config(auth, prefix=PREFIX)
    server = NatsServer(tmp_path / "store", config_file=config.server_config)
    server.start()
    try:
        async with AsyncExitStack() as stack:
            found = People(auth, server.url, stack)
            found.envs = {name: person_env(name, p, prefix=PREFIX) for name, p in persons.items()}
            found.envs["submitter"] = config.env(Role.SUBMITTER)
            found.envs["ops"] = config.env(Role.OPS)
            submitter = await found.bus("submitter")
            await submitter.ensure_stream()
            await KvJobStore.open(submitter, jobs_bucket(PREFIX))
            await declare_stores(submitter, PREFIX)
            yield found
    finally:
        server.stop()


@pytest.mark.parametrize("as_whom", ["alice", "jane.doe", "bob"])
async def test_the_server_refuses_a_persons_own_publish_of_a_request(
    people: People, as_whom: str
) -> None:
    """A person's credential publishes on their desk subject and nowhere else: not a request
    of their own (the desk puts it on the bus), let alone one as someone else."""
    alice = await people.bus("alice")
    with pytest.raises(BusPermissionError) as caught:
        await asyncio.wait_for(alice.publish(job_requested("job-x", owner=as_whom)), timeout=5)
    assert str(caught.value).startswith(
        f"NATS user 'alice' may not publish to '{PREFIX}.job.requested.{as_whom}'"
    )
    cancel = new_event(
        JobCancelRequested(job_id="job-x", requested_by=as_whom), source="t", time=NOW
    )
    with pytest.raises(BusPermissionError):
        await asyncio.wait_for(alice.publish(cancel), timeout=5)
    assert alice.is_connected


async def test_a_person_reads_no_one_elses_replies(people: People) -> None:
    alice = await people.bus("alice")
    jane = people.settings("jane.doe").nats_inbox_prefix
    with pytest.raises(BusPermissionError):
        await _listen(alice, f"{jane}.>")


async def _listen(bus: JetStreamBus, subject: str) -> None:
    async with bus.permission_checked(f"listen to {subject}"):
        await bus.client.subscribe(subject)
        await bus.client.flush()
        # A loaded server may answer the flush before it reports the refusal.
        await asyncio.sleep(0.5)


# --- the records desk: a person reads their own and their team's jobs only ---------------

TEAMS = parse_teams(
    """
[teams.vision]
members = ["alice", "jane.doe"]
admins = ["jane.doe"]
[teams.nlp]
members = ["bob"]
"""
)


class _Teams:
    def current(self) -> Teams:
        return TEAMS


def _record(job_id: str, owner: str, team: str) -> JobRecord:
    request = job_requested(job_id, owner=owner, env={"API_TOKEN": f"{owner}-secret"}).data
    return JobRecord(
        request=request,
        request_event_id=f"ev-{job_id}",
        state=JobState.QUEUED,
        accepted_at=NOW,
        updated_at=NOW,
        team=team,
    )


class Desk:
    """The desk on the submitter's own credential, two jobs of vision (alice's, jane.doe's)
    and one of nlp (bob's) in the bucket and on the stream, and clients as each person."""

    def __init__(self, people: People, submitter: JetStreamBus) -> None:
        self.people = people
        self.submitter = submitter

    async def client(self, name: str) -> SpotrainClient:
        bus = await self.people.bus(name)
        return SpotrainClient(bus, SystemClock(), person=name)

    async def publish(self, data: EventData, job_id: str) -> None:
        await self.submitter.publish(new_event(data, source="submitter", time=NOW, subject=job_id))


@pytest.fixture
async def desk(people: People) -> AsyncIterator[Desk]:
    ops = await people.bus("ops")
    submitter = await people.bus("submitter")
    store = await KvJobStore.open(submitter, jobs_bucket(PREFIX))
    found = Desk(people, submitter)
    for job_id, owner, team in (
        ("alice-1", "alice", "vision"),
        ("jane-1", "jane.doe", "vision"),
        ("bob-1", "bob", "nlp"),
    ):
        record = _record(job_id, owner, team)
        await store.create(record)
        await ops.publish(
            new_event(record.request, source=f"cli/{owner}", time=NOW, subject=job_id)
        )
        await found.publish(JobAccepted(job_id=job_id, owner=owner), job_id)
    # Ray's head away, and a lost attempt's output kept beside its checkpoints.
    ray, kept = FakeRay(), FakeProgress()
    ray.away = True
    lost = Attempt(
        number=1,
        submission_id="alice-2-1",
        state=AttemptState.LOST,
        submitted_at=NOW,
        cause=InterruptionCause.HEAD_LOST,
    )
    record = _record("alice-2", "alice", "vision").model_copy(
        update={"attempts": (lost,), "checkpoint_uri": "file:///checkpoints/alice-2"}
    )
    await store.create(record)
    kept.kept[("file:///checkpoints/alice-2", 1)] = "step 120\nthe head went\n"
    stop = asyncio.Event()
    serving = asyncio.create_task(RecordsDesk(submitter, store, _Teams(), ray, kept=kept).run(stop))
    try:
        alice = await found.client("alice")
        await eventually(lambda: _answers(alice), timeout_s=5)
        yield found
    finally:
        stop.set()
        await serving


async def _answers(client: SpotrainClient) -> bool:
    try:
        await client.jobs()
    except PlatformError:
        return False
    return True


async def test_a_person_lists_their_own_and_their_teams_jobs_only(desk: Desk) -> None:
    alice = await desk.client("alice")
    assert {r.job_id for r in await alice.jobs()} == {"alice-1", "alice-2", "jane-1"}
    [own] = [r for r in await alice.jobs() if r.job_id == "alice-1"]
    assert own.request.env == {"API_TOKEN": "alice-secret"}
    bob = await desk.client("bob")
    assert [r.job_id for r in await bob.jobs()] == ["bob-1"]
    # Another team's job is not there for bob, the same answer as a job that never was.
    assert await bob.job("alice-1") is None
    assert await bob.history("alice-1") == []
    with pytest.raises(PlatformError, match="no job alice-1"):
        await bob.cancel("alice-1", "bob")


async def test_a_lost_attempts_output_is_read_from_what_its_launcher_kept(desk: Desk) -> None:
    """Ray's head is away (or came back without its state): the attempt's output is the
    end the platform kept beside its checkpoints; another team's is not for bob."""
    alice = await desk.client("alice")
    assert await alice.attempt_logs("alice-2", 1) == "step 120\nthe head went\n"
    bob = await desk.client("bob")
    assert await bob.attempt_logs("alice-2", 1) is None, "as if there were no such job"


async def test_the_server_refuses_a_person_the_bucket_and_the_job_events(desk: Desk) -> None:
    bob = await desk.people.bus("bob")
    with pytest.raises(BusPermissionError):
        await _get_record(bob, "alice-1")
    with pytest.raises(BusPermissionError):
        await asyncio.wait_for(bob.read(f"{PREFIX}.job.>"), timeout=5)
    with pytest.raises(BusPermissionError):
        await _listen(bob, f"{PREFIX}.job.>")
    # Nor can he ask the desk as alice: the server refuses the subject.
    with pytest.raises(BusPermissionError):
        await _send(bob, desk_subject(PREFIX, "alice"))


async def _get_record(bus: JetStreamBus, job_id: str) -> None:
    async with bus.permission_checked("read the jobs bucket"):
        kv = await bus.client.jetstream().key_value(jobs_bucket(PREFIX))
        await kv.get(job_id)


async def _send(bus: JetStreamBus, subject: str) -> None:
    async with bus.permission_checked(f"send on {subject}", subject=subject):
        await bus.client.publish(subject, b"{}")
        await bus.client.flush()
        await asyncio.sleep(0.5)


async def test_a_team_admin_may_cancel_a_members_job_and_a_member_reads_it(desk: Desk) -> None:
    jane = await desk.client("jane.doe")
    await jane.cancel("alice-1", "jane.doe")  # her team's admin: asked, not refused
    alice = await desk.client("alice")
    assert (await alice.job("jane-1")) is not None
    with pytest.raises(PlatformError, match="only its owner may cancel it"):
        await alice.cancel("jane-1", "alice")


async def test_a_person_follows_their_job_to_its_end_through_the_desk(desk: Desk) -> None:
    alice = await desk.client("alice")
    seen: list[str] = []

    async def follow() -> None:
        async with contextlib.aclosing(alice.follow("alice-1")) as events:
            async for event in events:
                seen.append(type(event.data).__name__)

    following = asyncio.create_task(follow())
    await eventually(lambda: seen == ["JobRequested", "JobAccepted"], timeout_s=5)
    await desk.publish(JobCancelled(job_id="bob-1", attempt=None), "bob-1")
    await desk.publish(JobCancelled(job_id="alice-1", attempt=None), "alice-1")
    await asyncio.wait_for(following, timeout=5)  # news wakes the waiting ask at once
    assert seen == ["JobRequested", "JobAccepted", "JobCancelled"]


async def test_anothers_cost_events_come_under_an_alias_with_nothing_but_the_bill(
    desk: Desk,
) -> None:
    bob = await desk.client("bob")
    events = await bob.cost_events()
    requests = {e.data.job_id: e.data for e in events if isinstance(e.data, JobRequested)}
    assert set(requests) == {"bob-1", alias("alice-1"), alias("jane-1")}
    assert requests["bob-1"].env == {"API_TOKEN": "bob-secret"}
    hidden = requests[alias("alice-1")]
    assert (hidden.owner, hidden.env, hidden.entrypoint) == (HIDDEN_OWNER, {}, ("hidden",))
    assert "alice" not in "".join(encode(e).decode() for e in events if e.subject != "bob-1")


async def test_a_persons_request_goes_on_the_bus_under_their_name_and_namespace(
    desk: Desk,
) -> None:
    alice = await desk.client("alice")
    request = job_requested("job-a", owner="alice").data
    await alice.submit(request, answer_timeout_s=0.5)
    ops = await desk.people.bus("ops")
    stored = [m for m in await ops.read(f"{PREFIX}.job.requested.>") if b"job-a" in m.data]
    [message] = stored
    assert message.subject == f"{PREFIX}.job.requested.alice"
    event = decode(message.data)
    assert event.id.startswith("person:"), event.id
    assert message.headers["Nats-Msg-Id"] == event.id
    # The same request again (a retry) is stored once.
    again = encode(event.model_copy(update={"id": "client-id-1"})).decode()
    first = await alice._ask(DeskAsk(ask=Ask.SUBMIT, event=again))
    second = await alice._ask(DeskAsk(ask=Ask.SUBMIT, event=again))
    assert first.next_seq == second.next_seq


async def test_a_claim_to_be_someone_else_is_refused_and_dead_lettered(desk: Desk) -> None:
    """Alice asks the desk to submit a request in jane.doe's name: refused, in one line,
    and dead-lettered with the reason; nothing is stored on jane.doe's subject."""
    alice = await desk.client("alice")
    with pytest.raises(PlatformError, match="alice may send requests as alice only"):
        await alice.submit(job_requested("job-f", owner="jane.doe").data)
    ops = await desk.people.bus("ops")
    [letter] = await ops.read(dlq_subject(DESK, PREFIX))
    assert letter.headers["Spotrain-Dlq-Reason"] == "not-the-sender"
    assert letter.headers["Spotrain-Original-Subject"] == desk_subject(PREFIX, "alice")
    assert [m for m in await ops.read(f"{PREFIX}.job.requested.>") if b"job-f" in m.data] == []
    # Not an event at all: refused with the reason, dead-lettered too.
    with pytest.raises(PlatformError, match="not a request the platform takes"):
        await alice._ask(DeskAsk(ask=Ask.SUBMIT, event='{"hello": 1}'))
    assert len(await ops.read(dlq_subject(DESK, PREFIX))) == 2


async def test_the_client_acts_for_the_person_its_credentials_file_names(
    desk: Desk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`SPOTRAIN_CREDENTIALS`: the CLI and the SDK connect as jane.doe and submit as her."""
    people = desk.people
    credentials = tmp_path / "jane.env"
    write_env_file(credentials, people.envs["jane.doe"])
    assert credentials.stat().st_mode & 0o077 == 0, "never readable by others"
    for name in [n for n in os.environ if n.startswith("SPOTRAIN_NATS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SPOTRAIN_CREDENTIALS", str(credentials))
    monkeypatch.setenv("SPOTRAIN_NATS_URL", people.url)
    assert ClientBusSettings().nats_user == "jane.doe"
    assert current_user() == "jane.doe"
    async with await SpotrainClient.connect() as client:
        request = job_requested("job-j", owner=current_user()).data
        await client.submit(request, answer_timeout_s=0.5)
    ops = await people.bus("ops")
    stored = [m for m in await ops.read(f"{PREFIX}.job.requested.>") if b"job-j" in m.data]
    assert [m.subject for m in stored] == [f"{PREFIX}.job.requested.jane.doe"]


async def test_a_persons_workspace_goes_up_through_the_desk_under_their_name(
    desk: Desk, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    # Several parts, not a multiple of the part size.
    (project / "data.bin").write_bytes(os.urandom(PART_BYTES * 2 + 123))
    alice = await desk.client("alice")
    ref = await alice.upload_workspace(project)
    assert ref.name.startswith("alice.")
    assert ref.bucket == f"{PREFIX}-workspaces"
    submitter = desk.submitter.client.jetstream()
    stored = await (await submitter.object_store(ref.bucket)).get(ref.name)
    assert hashlib.sha256(stored.data or b"").hexdigest() == ref.sha256
    # The parts are gone; the same tree again is answered at once from the store.
    uploads = await submitter.object_store(f"{PREFIX}-uploads")
    assert [o for o in await _objects(uploads) if not o.deleted] == []
    assert await alice.upload_workspace(project) == ref
    # Bob's upload of the very same tree is his own object.
    bob = await desk.client("bob")
    assert (await bob.upload_workspace(project)).name == f"bob.{ref.sha256}.zip"


async def test_a_zip_bomb_is_refused_at_the_desk(desk: Desk) -> None:
    part = zip_bomb_part()
    assert part.size < PART_BYTES, "one part that unpacks to 120 MiB"
    alice = await desk.client("alice")
    with pytest.raises(PlatformError, match="unpacks to more than 100 MiB"):
        await alice._ask(DeskAsk(ask=Ask.UPLOAD, part=part))
    store = await desk.submitter.client.jetstream().object_store(f"{PREFIX}-workspaces")
    assert [o for o in await _objects(store) if not o.deleted] == []


def _first_part(size: int) -> UploadPart:
    """The first part of an upload of `size` bytes, which nobody will finish."""
    raw = os.urandom(PART_BYTES)
    return UploadPart(
        sha256=hashlib.sha256(raw).hexdigest(), size=size, offset=0,
        data=base64.b64encode(raw).decode(),
    )  # fmt: skip


async def test_one_person_may_stage_only_so_much_in_the_uploads_store(desk: Desk) -> None:
    """Alice begins uploads she never finishes: each reserves its whole size, and past her
    share the next is refused; bob begins his all the same, and a part without its upload's
    beginning is refused."""
    alice = await desk.client("alice")
    largest = DEFAULT_LIMIT_BYTES
    begun = [_first_part(largest) for _ in range(MOST_STAGED_BYTES // largest)]
    for part in begun:
        assert (await alice._ask(DeskAsk(ask=Ask.UPLOAD, part=part))).refused is None
    with pytest.raises(PlatformError, match="your unfinished uploads hold"):
        await alice._ask(DeskAsk(ask=Ask.UPLOAD, part=_first_part(largest)))
    # The same upload begun again takes its own place.
    assert (await alice._ask(DeskAsk(ask=Ask.UPLOAD, part=begun[0]))).refused is None
    bob = await desk.client("bob")
    assert (await bob._ask(DeskAsk(ask=Ask.UPLOAD, part=_first_part(largest)))).refused is None
    second = begun[0].model_copy(update={"sha256": "0" * 64, "offset": PART_BYTES})
    with pytest.raises(PlatformError, match="begins with its first part"):
        await bob._ask(DeskAsk(ask=Ask.UPLOAD, part=second))


async def _objects(store: Any) -> list[Any]:
    try:
        return list(await store.list())
    except nats.js.errors.NotFoundError:
        return []


async def test_the_desk_answers_no_reply_subject_but_the_askers_inbox(desk: Desk) -> None:
    """A reply subject is the asker's to choose: the desk answers its own inbox only, so
    its answer never lands, with its rights, in the event stream or another's inbox."""
    alice = await desk.people.bus("alice")
    ops = await desk.people.bus("ops")
    before = len(await ops.read(f"{PREFIX}.>"))
    ask = DeskAsk(ask=Ask.JOBS).model_dump_json().encode()
    for target in (f"{PREFIX}.job.requested.bob", f"{PREFIX}.job.cancel_requested.alice"):
        await alice.client.publish(desk_subject(PREFIX, "alice"), ask, reply=target)
    await alice.client.flush()
    await asyncio.sleep(1)
    assert len(await ops.read(f"{PREFIX}.>")) == before, "nothing stored"
    # Her own inbox is answered.
    assert await (await desk.client("alice")).jobs()


async def test_one_persons_flood_of_asks_leaves_room_for_another(desk: Desk) -> None:
    """Alice keeps many slow asks open at once; bob is answered at once all the same."""
    alice = await desk.client("alice")
    slow = DeskAsk(ask=Ask.HISTORY, job_id="alice-1", after_seq=10**9, wait_s=5)
    flood = [asyncio.create_task(alice._ask(slow)) for _ in range(MOST_ASKS_PER_PERSON * 3)]
    try:
        bob = await desk.client("bob")
        started = asyncio.get_running_loop().time()
        assert [r.job_id for r in await bob.jobs()] == ["bob-1"]
        assert asyncio.get_running_loop().time() - started < 2
        results = await asyncio.gather(*flood, return_exceptions=True)
        refused = [r for r in results if isinstance(r, PlatformError)]
        assert refused, "past her share, asks are refused at once"
        assert all("asks of yours are being answered" in str(r) for r in refused)
    finally:
        for task in flood:
            task.cancel()


async def test_past_a_persons_share_of_requests_the_desk_says_when_to_send_again(
    desk: Desk,
) -> None:
    alice = await desk.client("alice")

    async def request(n: int) -> float | None:
        event = new_event(
            job_requested(f"flood-{n}", owner="alice").data, source="cli/alice", time=NOW
        )
        try:
            await alice._ask(DeskAsk(ask=Ask.SUBMIT, event=encode(event).decode()))
        except DeskRefusedError as refusal:
            return refusal.retry_after_s if refusal.retry_after_s is not None else -1.0
        return None

    waits = [await request(n) for n in range(REQUESTS_BURST + 5)]
    assert waits[:REQUESTS_BURST] == [None] * REQUESTS_BURST
    assert all(w is not None and 0 < w <= 1 / REQUESTS_PER_S for w in waits[REQUESTS_BURST:])
    # Bob's share is his own; and alice's client waits as told and gets through.
    bob = await desk.client("bob")
    await bob.submit(job_requested("bob-2", owner="bob").data, answer_timeout_s=0.1)
    await alice.submit(job_requested("alice-late", owner="alice").data, answer_timeout_s=0.1)
    ops = await desk.people.bus("ops")
    stored = {m.subject for m in await ops.read(f"{PREFIX}.job.requested.>")}
    assert {f"{PREFIX}.job.requested.bob", f"{PREFIX}.job.requested.alice"} <= stored
