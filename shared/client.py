"""The client SDK: what the CLI, notebooks and bots use to talk to the platform.

It speaks only to the bus: it publishes requests and reads the `jobs` bucket and the event
stream, or, connected as a person with a credential of their own, asks the records desk
for the jobs they may read (`shared.desk`). It never imports Ray, so it is quick to import.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import getpass
import re
import secrets
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Self, cast

import nats.errors
import nats.js.errors
from pydantic import ValidationError

from shared.clock import Clock, SystemClock
from shared.desk import (
    MAX_WAIT_S,
    MOST_ASKS_PER_PERSON,
    PART_BYTES,
    Ask,
    DeskAnswer,
    DeskAsk,
    UploadPart,
    desk_subject,
    part_offsets,
)
from shared.events import Event, EventData, decode, encode, new_event, subject_for, subjects_for
from shared.events.data import (
    JobAccepted,
    JobCancelled,
    JobCancelRequested,
    JobFailed,
    JobRejected,
    JobRequested,
    JobSucceeded,
)
from shared.events.types import ObjectRef
from shared.jobs import JobRecord, JobsBucket, jobs_bucket, refusals_bucket
from shared.messaging import BusSettings, EventBus
from shared.messaging.jetstream import BusUnavailableError, JetStreamBus
from shared.messaging.ports import NoAnswerError
from shared.messaging.settings import (
    CREDENTIALS_VARIABLE,
    ClientBusSettings,
    Role,
    credentials_file,
)
from shared.policy.cost import COST_EVENTS, Ledger, PoolPrice, ledger
from shared.policy.pool_knowledge import KNOWLEDGE_KEY, PoolsKnowledge
from shared.policy.teams import STATUS_KEY as TEAMS_STATUS_KEY
from shared.policy.teams import TeamsStatus, teams_bucket
from shared.pools import (
    SIGHTINGS_KEY,
    STATUS_KEY,
    NodeSightings,
    PoolsStatus,
    billed_up_to,
    pools_bucket,
)
from shared.workspace import PackedWorkspace, pack, upload

TERMINAL_EVENTS = (JobSucceeded, JobFailed, JobCancelled, JobRejected)


class PlatformError(RuntimeError):
    """The platform refused or could not be reached; the message is for the user."""


class DeskRefusedError(PlatformError):
    """The desk would not answer; `retry_after_s` when only for now (a share used up)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def new_job_id(entrypoint: Sequence[str]) -> str:
    """A readable, unique id: the script's name and a random suffix (`train-3f9a1c`)."""
    stem = Path(
        entrypoint[1] if len(entrypoint) > 1 and entrypoint[0] == "python" else entrypoint[0]
    ).stem
    slug = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:40] or "job"
    return f"{slug}-{secrets.token_hex(3)}"


def person_of(settings: BusSettings) -> str | None:
    """The person whose own credential the settings connect with (`spotrain users add`);
    None for a role's credential, or none."""
    named = settings.nats_user
    return named if named and named not in {role.value for role in Role} else None


def current_user() -> str:
    """Who the client acts for: the person whose own credential it connects with
    (`spotrain users add`; the server lets it publish requests on that name only), else
    the login name."""
    try:
        named = person_of(ClientBusSettings())
    except ValidationError:
        named = None  # connecting reports what is wrong with the settings
    if named:
        return named
    user = re.sub(r"[^A-Za-z0-9._@-]+", "-", getpass.getuser()).strip("-")
    return user or "unknown"


def current_user_is_a_person() -> bool:
    """Whether the client connects with a person's own credential (`spotrain users add`),
    which asks the desk for everything."""
    try:
        return person_of(ClientBusSettings()) is not None
    except ValidationError:
        return False


class SpotrainClient:
    def __init__(self, bus: EventBus, clock: Clock, *, person: str | None = None) -> None:
        """`person`: connected on their own credential, which reads jobs through the
        records desk only; None for a role's, which reads the bucket and the stream."""
        self._bus = bus
        self._clock = clock
        self._person = person

    @classmethod
    async def connect(cls, settings: BusSettings | None = None) -> Self:
        if settings is None:
            credentials = credentials_file()
            if credentials is not None and not credentials.is_file():
                msg = f"{CREDENTIALS_VARIABLE} names {credentials}, which is not a file"
                raise PlatformError(msg)
            settings = ClientBusSettings(connect_timeout_s=3)
        try:
            bus = await JetStreamBus.connect(settings, name="spotrain-client")
        except BusUnavailableError:
            msg = (
                f"the stack is not running (no NATS at {settings.nats_url}); start it: spotrain up"
            )
            raise PlatformError(msg) from None
        return cls(bus, SystemClock(), person=person_of(settings))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._bus.close()

    @property
    def prefix(self) -> str:
        return self._bus.prefix

    async def upload_workspace(self, root: Path, owner: str | None = None) -> ObjectRef:
        """Pack `root` and store it as `owner`'s (the person connected, else the login
        name): a job may only run its own owner's workspace."""
        packed = await asyncio.to_thread(pack, root)
        if self._person is not None:
            return await self._upload_asking(packed)
        owner = owner or current_user()
        try:
            return await upload(self._bus, self.prefix, packed, owner)
        except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError) as error:
            # Past the wait for a cluster's new leader: said in one line, not a traceback.
            msg = f"NATS did not take the workspace in time ({error}); try again"
            raise PlatformError(msg) from error

    async def _upload_asking(self, packed: PackedWorkspace) -> ObjectRef:
        """Up through the desk, part after part; the first answer is the workspace at once
        when this person stored the same tree before."""
        for offset in part_offsets(len(packed.data)):
            raw = packed.data[offset : offset + PART_BYTES]
            part = UploadPart(
                sha256=packed.sha256,
                size=len(packed.data),
                offset=offset,
                data=base64.b64encode(raw).decode(),
            )
            answer = await self._ask(DeskAsk(ask=Ask.UPLOAD, part=part))
            if answer.workspace is not None:
                return answer.workspace
        raise PlatformError("the desk took every part of the workspace but did not store it")

    async def submit(
        self, request: JobRequested, *, answer_timeout_s: float = 5.0
    ) -> Event[JobAccepted] | Event[JobRejected] | None:
        """Publish the request and wait for the submitter's answer, accepted or rejected.

        None when no answer came in time: the request is stored and will be handled.
        """
        if self._person is not None:
            return await self._submit_asking(request, answer_timeout_s)
        answers: asyncio.Queue[Event[Any]] = asyncio.Queue()

        async def on_answer(data: bytes) -> None:
            try:
                event = decode(data)
            except ValueError:
                return
            if (
                event.subject == request.job_id
                or getattr(event.data, "job_id", None) == request.job_id
            ):
                answers.put_nowait(event)

        # Subscribed before publishing, so a quick answer is not missed.
        subs = [
            await self._bus.listen(subject_for(model, self.prefix), on_answer)
            for model in (JobAccepted, JobRejected)
        ]
        try:
            event = new_event(
                request,
                source=f"cli/{request.owner}",
                time=self._clock.now(),
                subject=request.job_id,
            )
            await self._bus.publish(event)
            try:
                answer = await asyncio.wait_for(answers.get(), timeout=answer_timeout_s)
            except TimeoutError:
                return None
            return answer
        finally:
            for sub in subs:
                await sub.stop()

    async def submit_many(
        self, requests: Sequence[JobRequested], *, answer_timeout_s: float = 30.0
    ) -> dict[str, Event[JobAccepted] | Event[JobRejected] | None]:
        """Publish many requests (a sweep's) at once and wait for every answer: each job
        id to its answer, None where none came in time (the request is stored and will
        be handled)."""
        wanted = {request.job_id for request in requests}
        answers: dict[str, Event[JobAccepted] | Event[JobRejected] | None] = dict.fromkeys(wanted)
        if self._person is not None:
            # A person's credential asks the desk for each answer: a few at a time.
            # Half the desk's share of asks at once: a `watch` beside it is still answered.
            limit = asyncio.Semaphore(MOST_ASKS_PER_PERSON // 2)

            async def one(request: JobRequested) -> None:
                async with limit:
                    answers[request.job_id] = await self._submit_asking(request, answer_timeout_s)

            await asyncio.gather(*(one(request) for request in requests))
            return answers
        done = asyncio.Event()
        left = set(wanted)

        async def on_answer(data: bytes) -> None:
            try:
                event = decode(data)
            except ValueError:
                return
            job_id = getattr(event.data, "job_id", None)
            if job_id in left:
                left.discard(job_id)
                answers[job_id] = cast("Event[JobAccepted] | Event[JobRejected]", event)
                if not left:
                    done.set()

        # Subscribed before publishing, so a quick answer is not missed.
        subs = [
            await self._bus.listen(subject_for(model, self.prefix), on_answer)
            for model in (JobAccepted, JobRejected)
        ]
        try:
            for request in requests:
                event = new_event(
                    request,
                    source=f"cli/{request.owner}",
                    time=self._clock.now(),
                    subject=request.job_id,
                )
                await self._bus.publish(event)
            if left:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), timeout=answer_timeout_s)
            return answers
        finally:
            for sub in subs:
                await sub.stop()

    async def cancel(self, job_id: str, requested_by: str) -> None:
        """Ask for the job to stop; a job is its owner's to cancel, or its team admin's
        (the submitter refuses anyone else's request, so this says so before asking)."""
        if self._person is not None:
            answer = await self._ask(DeskAsk(ask=Ask.JOB, job_id=job_id))
            record = answer.records[0] if answer.records else None
            may_cancel = answer.may_cancel
        else:
            record = await self.job(job_id)
            may_cancel = record is not None and record.request.owner == requested_by
        if record is None:
            raise PlatformError(f"no job {job_id}")
        if not may_cancel:
            msg = f"{job_id} is {record.request.owner}'s: only its owner may cancel it"
            raise PlatformError(msg)
        event = new_event(
            JobCancelRequested(job_id=job_id, requested_by=requested_by),
            source=f"cli/{requested_by}",
            time=self._clock.now(),
            subject=job_id,
        )
        if self._person is not None:
            await self._submit_to_desk(event)
            return
        await self._bus.publish(event)

    async def jobs(self) -> list[JobRecord]:
        """Every job the client may read, newest first."""
        if self._person is not None:
            return [
                r for answer in await self._pages(DeskAsk(ask=Ask.JOBS)) for r in answer.records
            ]
        try:
            records = await self._jobs_bucket().all()
        except nats.errors.TimeoutError as error:
            raise PlatformError("NATS did not answer in time") from error
        return sorted(records, key=lambda r: r.accepted_at, reverse=True)

    async def job(self, job_id: str) -> JobRecord | None:
        """The job's record; None if there is none the client may read."""
        if self._person is not None:
            answer = await self._ask(DeskAsk(ask=Ask.JOB, job_id=job_id))
            return answer.records[0] if answer.records else None
        try:
            return await self._jobs_bucket().get(job_id)
        except nats.errors.TimeoutError as error:
            raise PlatformError("NATS did not answer in time") from error

    async def history(self, job_id: str) -> list[Event[EventData]]:
        """Every stored event about the job, oldest first."""
        if self._person is not None:
            pages = await self._pages(DeskAsk(ask=Ask.HISTORY, job_id=job_id))
            return _decoded(answer for answer in pages)
        events = []
        for stored in await self._bus.read(f"{self.prefix}.job.>"):
            try:
                event = decode(stored.data)
            except ValueError:
                continue
            if getattr(event.data, "job_id", None) == job_id:
                events.append(event)
        return events

    async def follow(self, job_id: str) -> AsyncGenerator[Event[EventData], None]:
        """The job's events as they happen, from the first; ends after its terminal event.

        Use it inside `contextlib.aclosing` when you may stop before the end."""
        if self._person is not None:
            async for event in self._follow_asking(job_id):
                yield event
            return
        queue: asyncio.Queue[Event[EventData]] = asyncio.Queue()
        seen: set[str] = set()

        async def on_event(data: bytes) -> None:
            try:
                event = decode(data)
            except ValueError:
                return
            if getattr(event.data, "job_id", None) == job_id:
                queue.put_nowait(event)

        # Subscribed before reading the history, so nothing falls between the two.
        sub = await self._bus.listen(f"{self.prefix}.job.>", on_event)
        try:
            for event in await self.history(job_id):
                seen.add(event.id)
                yield event
                if isinstance(event.data, TERMINAL_EVENTS):
                    return
            while True:
                event = await queue.get()
                if event.id in seen:
                    continue
                seen.add(event.id)
                yield event
                if isinstance(event.data, TERMINAL_EVENTS):
                    return
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.stop()

    async def cost_events(self) -> list[Event[EventData]]:
        """The stored events cost accounting reads (node lifetimes, job placements and
        outcomes), oldest first; job progress, the bulk of the stream, is not read.
        A person asks the desk for them: others' jobs come under an alias, with only what
        the bill needs (`shared.desk.hidden`)."""
        if self._person is not None:
            pages = await self._pages(DeskAsk(ask=Ask.COST))
            stored = [(e.seq, e.event.encode()) for answer in pages for e in answer.events]
        else:
            subjects = subjects_for(COST_EVENTS, self.prefix)
            try:
                batches = await asyncio.gather(*(self._bus.read(subject) for subject in subjects))
            except nats.js.errors.NotFoundError:
                return []  # no stream yet: nothing was ever recorded
            stored = [(m.seq, m.data) for batch in batches for m in batch]
        events = []
        for _, data in sorted(stored, key=lambda pair: pair[0]):
            try:
                events.append(decode(data))
            except ValueError:
                continue
        return events

    async def costs(
        self, *, since: datetime | None = None, prices: Mapping[str, PoolPrice] | None = None
    ) -> Ledger:
        """Every node-second billed since `since` (all of it by default) up to now,
        attributed to the attempts that held the nodes or to idle; see `shared.policy.cost`."""
        # Sightings first: a node closed after they were read has its end among the events;
        # read the other way round, it would be open with no sighting, billed nothing.
        sightings = await self.sightings()
        events = await self.cost_events()
        return ledger(
            events,
            now=self._clock.now(),
            since=since,
            prices=prices,
            seen=billed_up_to(sightings),
        )

    async def sightings(self) -> NodeSightings | None:
        """When the scaler last saw each node open on the ledger; None before its first
        pass (or from a scaler that does not post them)."""
        value = await self._pools_entry(SIGHTINGS_KEY)
        return NodeSightings.model_validate_json(value) if value else None

    async def pools(self) -> PoolsStatus | None:
        """The scaler's latest view of the pools; None before its first pass."""
        value = await self._pools_entry(STATUS_KEY)
        return PoolsStatus.model_validate_json(value) if value else None

    async def knowledge(self) -> PoolsKnowledge | None:
        """What the scaler has learnt of each pool (stock-outs, losses, windows of
        availability); None before its first pass."""
        value = await self._pools_entry(KNOWLEDGE_KEY)
        return PoolsKnowledge.model_validate_json(value) if value else None

    async def teams(self) -> TeamsStatus | None:
        """The submitter's latest view of teams: quotas, holds, jobs waiting; None on a
        platform without a teams file (or before the submitter's first pass)."""
        if self._person is not None:
            value = await self._asked_entry(Ask.TEAMS, TEAMS_STATUS_KEY)
        else:
            value = await self._entry(teams_bucket(self.prefix), TEAMS_STATUS_KEY)
        return TeamsStatus.model_validate_json(value) if value else None

    async def _asked_entry(self, ask: Ask, key: str) -> bytes | None:
        entry = (await self._ask(DeskAsk(ask=ask))).entries.get(key)
        return entry.encode() if entry is not None else None

    async def attempt_logs(self, job_id: str, attempt: int) -> str | None:
        """What an attempt printed, through the desk (a person's credential: Ray's job API
        answers the submitter only); None when Ray keeps nothing for it."""
        if self._person is None:
            raise PlatformError("a role's credential reads logs from Ray's dashboard")
        return (await self._ask(DeskAsk(ask=Ask.LOGS, job_id=job_id, attempt=attempt))).logs

    async def _ask(self, ask: DeskAsk) -> DeskAnswer:
        """One ask of the records desk, on this person's own subject."""
        assert self._person is not None
        subject = desk_subject(self.prefix, self._person)
        try:
            reply = await self._bus.request(
                subject, ask.model_dump_json().encode(), timeout_s=ask.wait_s + 5
            )
        except NoAnswerError:
            msg = "the submitter is not answering (its records desk is not up); try again soon"
            raise PlatformError(msg) from None
        except TimeoutError:
            raise PlatformError("the submitter's records desk did not answer in time") from None
        answer = DeskAnswer.model_validate_json(reply)
        if answer.refused is not None:
            raise DeskRefusedError(answer.refused, answer.retry_after_s)
        return answer

    async def _submit_to_desk(self, event: Event[Any], *, most_waits: int = 30) -> DeskAnswer:
        """A request through the desk; past this person's share, sent again when the desk
        says (the same event: stored once, whatever the retries)."""
        ask = DeskAsk(ask=Ask.SUBMIT, event=encode(event).decode())
        for _ in range(most_waits):
            try:
                return await self._ask(ask)
            except DeskRefusedError as refusal:
                if refusal.retry_after_s is None:
                    raise
                await asyncio.sleep(refusal.retry_after_s)
        return await self._ask(ask)

    async def _pages(self, ask: DeskAsk) -> list[DeskAnswer]:
        """Every page of an answer: asked again from where each stopped while it says more."""
        answers = [await self._ask(ask)]
        while answers[-1].more:
            ask = ask.model_copy(update={"after_seq": answers[-1].next_seq})
            answers.append(await self._ask(ask))
        return answers

    async def _follow_asking(self, job_id: str) -> AsyncGenerator[Event[EventData], None]:
        ask = DeskAsk(ask=Ask.HISTORY, job_id=job_id)
        while True:
            answer = await self._ask(ask)
            for event in _decoded([answer]):
                yield event
                if isinstance(event.data, TERMINAL_EVENTS):
                    return
            # What has been seen is not asked for again; the next ask waits for news.
            wait_s = 0.0 if answer.more else MAX_WAIT_S
            ask = ask.model_copy(update={"after_seq": answer.next_seq, "wait_s": wait_s})

    async def _submit_asking(
        self, request: JobRequested, answer_timeout_s: float
    ) -> Event[JobAccepted] | Event[JobRejected] | None:
        """Submit as a person: the desk puts the request on the bus, under their name; then
        ask it for the job's first answer."""
        event = new_event(
            request, source=f"cli/{request.owner}", time=self._clock.now(), subject=request.job_id
        )
        stored = await self._submit_to_desk(event)
        deadline = asyncio.get_running_loop().time() + answer_timeout_s
        # The answer comes after the request: the stream stored it after this sequence.
        ask = DeskAsk(ask=Ask.HISTORY, job_id=request.job_id, after_seq=stored.next_seq)
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            try:
                answer = await self._ask(ask.model_copy(update={"wait_s": min(left, MAX_WAIT_S)}))
            except PlatformError:
                return None  # stored all the same: it is handled once the desk is up
            for found in _decoded([answer]):
                if isinstance(found.data, JobAccepted | JobRejected):
                    return cast("Event[JobAccepted] | Event[JobRejected]", found)
            ask = ask.model_copy(update={"after_seq": answer.next_seq})
        return None

    async def _pools_entry(self, key: str) -> bytes | None:
        """One key of the scaler's `pools` bucket; None while there is no such key."""
        if self._person is not None:
            return await self._asked_entry(Ask.POOLS, key)
        return await self._entry(pools_bucket(self.prefix), key)

    def _jobs_bucket(self) -> JobsBucket:
        jobs = jobs_bucket(self.prefix)
        return JobsBucket(self._bus.bucket(jobs), self._bus.bucket(refusals_bucket(jobs)))

    async def _entry(self, bucket: str, key: str) -> bytes | None:
        """The key's value; None while the bucket or the key has none. Through a cluster's
        election (the bucket's port waits for a new leader), then one line."""
        try:
            entry = await self._bus.bucket(bucket).get(key)
        except nats.errors.TimeoutError as error:
            raise PlatformError("NATS did not answer in time") from error
        return entry.value if entry is not None else None


def _decoded(answers: Iterable[DeskAnswer]) -> list[Event[EventData]]:
    events = []
    for answer in answers:
        for stored in answer.events:
            try:
                events.append(decode(stored.event.encode()))
            except ValueError:
                continue
    return events
