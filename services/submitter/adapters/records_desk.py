"""The desk (`shared.desk`): answers each person's asks with the jobs they may read, from
the `jobs` bucket and the event stream; puts their requests on the bus under their name;
takes their workspaces. Several submitter replicas answer as one queue group; an ask that
waits for news holds no consumer, only a wait on the job's events as they happen.

Only to the asker's own inbox, and only so many asks of one person at once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import nats.errors
import structlog
from pydantic import ValidationError

from services.submitter import policy
from services.submitter.adapters.desk_allowances import KvAllowances
from services.submitter.adapters.desk_uploads import DeskUploads
from services.submitter.ports import (
    JobStore,
    ProgressReader,
    RayJobs,
    RequestAllowances,
    TeamsSource,
)
from shared.desk import (
    ANSWER_LIMIT_BYTES,
    DESK,
    MOST_ASKS_PER_PERSON,
    Ask,
    DeskAnswer,
    DeskAsk,
    Forward,
    RefuseRequest,
    StoredEvent,
    asker,
    desk_subject,
    desk_subjects,
    forward_request,
    hidden,
    page,
    replies_to_asker,
    teams_status_for,
)
from shared.events import (
    decode,
    dlq_subject,
    encode,
    subjects_for,
)
from shared.jobs import JobRecord
from shared.messaging import EventBus
from shared.messaging.dead_letters import DETAIL, MSG_ID, ORIGINAL_SUBJECT, REASON, SERVICE
from shared.messaging.kv_store import InMemoryKeyValue
from shared.messaging.ports import Asked, StoredMessage
from shared.policy.cost import COST_EVENTS
from shared.policy.pool_knowledge import KNOWLEDGE_KEY
from shared.policy.teams import STATUS_KEY as TEAMS_STATUS_KEY
from shared.policy.teams import Teams, TeamsStatus, teams_bucket
from shared.pools import SIGHTINGS_KEY, STATUS_KEY, pools_bucket
from shared.ray_head import RayHeadUnavailableError

log = structlog.get_logger()

QUEUE_GROUP = "records-desk"
MOST_ASKS_AT_ONCE = 256
"""Asks answered at once; more wait their turn (a follower waits up to 20 s for news)."""


class RecordsDesk:
    def __init__(
        self,
        bus: EventBus,
        store: JobStore,
        teams: TeamsSource | None,
        ray: RayJobs | None = None,
        allowances: RequestAllowances | None = None,
        *,
        kept: ProgressReader | None = None,
    ) -> None:
        self._bus = bus
        self._ray = ray
        self._kept = kept
        self._store = store
        self._teams = teams
        self._news: dict[str, asyncio.Event] = {}
        self._answering = asyncio.Semaphore(MOST_ASKS_AT_ONCE)
        self._tasks: set[asyncio.Task[None]] = set()
        self._in_flight: dict[str, int] = {}
        # Alone (a test, one replica), the desk counts in its own memory.
        self._allowances = allowances or KvAllowances(InMemoryKeyValue(), time.monotonic)
        self._uploads = DeskUploads(bus, bus.prefix)

    async def run(self, stop: asyncio.Event) -> None:
        """Answer until `stop` is set; a `Watch` of the submitter's runtime."""
        prefix = self._bus.prefix
        asks = await self._bus.serve(desk_subjects(prefix), self._on_ask, group=QUEUE_GROUP)
        log.info("desk.open", subjects=desk_subjects(prefix))
        try:
            # News of the jobs' events, read from the stream as it stores them (a service
            # pulls; it never listens in), to wake the asks waiting for them.
            news = self._bus.follow([f"{prefix}.job.>"], stop)
            async with contextlib.aclosing(news) as records:
                async for record in records:
                    self._on_news(record.data)
        finally:
            await asks.stop()
            for task in list(self._tasks):
                task.cancel()

    def _on_news(self, data: bytes) -> None:
        try:
            job_id = getattr(decode(data).data, "job_id", None)
        except ValueError:
            return
        if job_id is not None and (waiting := self._news.pop(job_id, None)) is not None:
            waiting.set()

    async def _on_ask(self, msg: Asked) -> None:
        reader = asker(msg.subject, self._bus.prefix)
        if reader is None or msg.reply is None or not replies_to_asker(msg.reply, reader):
            # Answered to any other subject, the answer would go there with the submitter's
            # rights: into the event stream, or to someone else's inbox.
            log.warning("desk.reply_refused", subject=msg.subject, reply=msg.reply)
            return
        if self._in_flight.get(reader, 0) >= MOST_ASKS_PER_PERSON:
            refused = DeskAnswer(
                refused=f"{MOST_ASKS_PER_PERSON} asks of yours are being answered; ask again"
                " once they are",
                retry_after_s=1.0,
            )
            await self._respond(msg, refused)
            return
        self._in_flight[reader] = self._in_flight.get(reader, 0) + 1
        # A callback holds up the next message until it returns: each ask is its own task,
        # so one that waits for news delays nobody.
        task = asyncio.create_task(self._answer(msg, reader))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, msg: Asked, reader: str) -> None:
        try:
            async with self._answering:
                try:
                    ask = DeskAsk.model_validate_json(msg.data)
                except ValidationError as error:
                    problem = error.errors()[0]
                    answer = DeskAnswer(refused=f"not an ask the desk knows: {problem['msg']}")
                else:
                    try:
                        answer = await self._answer_ask(ask, reader)
                    except Exception:
                        log.exception("desk.failed", ask=ask.ask, reader=reader)
                        answer = DeskAnswer(refused="the desk failed; see the submitter's log")
                await self._respond(msg, answer)
        finally:
            left = self._in_flight.pop(reader, 1) - 1
            if left:
                self._in_flight[reader] = left

    async def _respond(self, msg: Asked, answer: DeskAnswer) -> None:
        await self._bus.answer(msg, answer.model_dump_json().encode())

    async def _answer_ask(self, ask: DeskAsk, reader: str) -> DeskAnswer:
        teams = self._teams.current() if self._teams is not None else None
        match ask.ask:
            case Ask.JOBS:
                return await self._jobs(ask, reader, teams)
            case Ask.JOB | Ask.HISTORY | Ask.LOGS:
                if ask.job_id is None:
                    return DeskAnswer(refused=f"an ask for {ask.ask.value} names a job")
                found = await self._store.get(ask.job_id)
                if found is None or not policy.may_read(found[0], reader, teams):
                    return DeskAnswer()  # the same answer whether it is not there or not theirs
                record = found[0]
                if ask.ask is Ask.LOGS:
                    return await self._logs(record, ask.attempt)
                if ask.ask is Ask.JOB:
                    may_cancel = policy.who_may_not_cancel(record, reader, teams) is None
                    return DeskAnswer(records=(record,), may_cancel=may_cancel)
                return await self._history(ask, record.job_id)
            case Ask.COST:
                return await self._cost(ask, reader, teams)
            case Ask.SUBMIT:
                return await self._submit(ask, reader)
            case Ask.POOLS:
                keys = (STATUS_KEY, KNOWLEDGE_KEY, SIGHTINGS_KEY)
                return DeskAnswer(entries=await self._entries(pools_bucket(self._bus.prefix), keys))
            case Ask.TEAMS:
                return await self._teams_status(reader)
            case Ask.UPLOAD:
                if ask.part is None:
                    return DeskAnswer(refused="an upload ask carries a part")
                return await self._uploads.take(ask.part, reader)

    async def _submit(self, ask: DeskAsk, reader: str) -> DeskAnswer:
        """The request as `forward_request` decides it (the refused dead-lettered); past
        the person's share of requests, refused with when to send it again."""
        if (wait_s := await self._allowances.take(reader)) is not None:
            return DeskAnswer(
                refused=f"{reader} sent more requests than their share; send again in "
                f"{wait_s:.1f} s",
                retry_after_s=wait_s,
            )
        raw = (ask.event or "").encode()
        match forward_request(raw, reader, self._bus.prefix):
            case RefuseRequest(answer=answer, reason=reason, detail=detail):
                await self._dead_letter(raw, reader, reason, detail)
                return DeskAnswer(refused=answer)
            case Forward(subject=subject, event=event):
                ack = await self._bus.publish_raw(subject, encode(event), {MSG_ID: event.id})
                return DeskAnswer(next_seq=ack.seq)

    async def _dead_letter(self, raw: bytes, reader: str, reason: str, detail: str) -> None:
        headers = {
            REASON: reason,
            DETAIL: " ".join(detail.split())[:1024],
            SERVICE: DESK,
            ORIGINAL_SUBJECT: desk_subject(self._bus.prefix, reader),
        }
        with contextlib.suppress(nats.errors.Error, OSError):
            await self._bus.publish_raw(dlq_subject(DESK, self._bus.prefix), raw, headers)

    async def _teams_status(self, reader: str) -> DeskAnswer:
        bucket = teams_bucket(self._bus.prefix)
        entries = await self._entries(bucket, (TEAMS_STATUS_KEY,))
        if (raw := entries.get(TEAMS_STATUS_KEY)) is not None:
            status = TeamsStatus.model_validate_json(raw)
            entries[TEAMS_STATUS_KEY] = teams_status_for(status, reader).model_dump_json()
        return DeskAnswer(entries=entries)

    async def _entries(self, bucket: str, keys: tuple[str, ...]) -> dict[str, str]:
        kv = self._bus.bucket(bucket)
        entries = {}
        for key in keys:
            entry = await kv.get(key)
            if entry is not None and entry.value:
                entries[key] = entry.value.decode()
        return entries

    async def _logs(self, record: JobRecord, number: int | None) -> DeskAnswer:
        attempt = next((a for a in record.attempts if a.number == number), None)
        if attempt is None:
            return DeskAnswer(refused=f"{record.job_id} has no attempt {number}")
        if self._ray is None:
            return DeskAnswer(refused="this desk reads no logs")
        try:
            text = await self._ray.logs(attempt.submission_id)
        except RayHeadUnavailableError:
            text = None
        if not text and self._kept is not None and record.checkpoint_uri is not None:
            # What Ray no longer has (a head back without its state, or away): the end
            # of it, as the attempt's launcher kept it.
            text = await self._kept.kept_output(record.checkpoint_uri, attempt.number)
        if text is not None and len(text) > ANSWER_LIMIT_BYTES:
            text = text[-ANSWER_LIMIT_BYTES:]  # the end of a long run's output matters most
        return DeskAnswer(logs=text)

    async def _jobs(self, ask: DeskAsk, reader: str, teams: Teams | None) -> DeskAnswer:
        records = sorted(
            (r for r, _ in await self._store.all() if policy.may_read(r, reader, teams)),
            key=lambda r: (r.accepted_at, r.job_id),
            reverse=True,
        )
        # Records carry no sequence: a page goes on from how many were answered before.
        rest = records[ask.after_seq :]
        count = page(rest, lambda r: len(r.model_dump_json()))
        return DeskAnswer(
            records=tuple(rest[:count]),
            next_seq=ask.after_seq + count,
            more=count < len(rest),
        )

    async def _history(self, ask: DeskAsk, job_id: str) -> DeskAnswer:
        subject = f"{self._bus.prefix}.job.>"
        after = ask.after_seq
        deadline = asyncio.get_running_loop().time() + ask.wait_s
        while True:
            # Waiting is registered before reading: news that comes between is not missed.
            news = self._news.setdefault(job_id, asyncio.Event())
            stored = await self._bus.read(subject, after_seq=after)
            after = _last_seq(stored, after)
            mine = [m for m in stored if _job_of(m) == job_id]
            left = deadline - asyncio.get_running_loop().time()
            if mine or left <= 0:
                return _events_answer(mine, scanned_to=after)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(news.wait(), timeout=left)

    async def _cost(self, ask: DeskAsk, reader: str, teams: Teams | None) -> DeskAnswer:
        readable = {
            r.job_id for r, _ in await self._store.all() if policy.may_read(r, reader, teams)
        }
        subjects = subjects_for(COST_EVENTS, self._bus.prefix)
        batches = await asyncio.gather(
            *(self._bus.read(subject, after_seq=ask.after_seq) for subject in subjects)
        )
        stored = sorted((m for batch in batches for m in batch), key=lambda m: m.seq)

        def shown(message: StoredMessage) -> StoredMessage | None:
            try:
                event = decode(message.data)
            except ValueError:
                return None  # nothing the ledger reads, and nothing to show as it is
            job_id = getattr(event.data, "job_id", None)
            if job_id is None or job_id in readable:
                return message  # a node's event, or a job the reader may see
            return StoredMessage(message.seq, message.subject, encode(hidden(event)), {})

        answered = [m for m in map(shown, stored) if m is not None]
        return _events_answer(answered, scanned_to=_last_seq(stored, ask.after_seq))


def _job_of(message: StoredMessage) -> str | None:
    try:
        job_id = getattr(decode(message.data).data, "job_id", None)
    except ValueError:
        return None
    return job_id if isinstance(job_id, str) else None


def _last_seq(stored: list[StoredMessage], otherwise: int) -> int:
    return stored[-1].seq if stored else otherwise


def _events_answer(messages: list[StoredMessage], *, scanned_to: int) -> DeskAnswer:
    size: Callable[[StoredMessage], int] = lambda m: len(m.data) + 32  # noqa: E731
    count = page(messages, size)
    more = count < len(messages)
    events = tuple(StoredEvent(seq=m.seq, event=m.data.decode()) for m in messages[:count])
    return DeskAnswer(
        events=events,
        next_seq=events[-1].seq if more else scanned_to,
        more=more,
    )
