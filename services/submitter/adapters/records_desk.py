"""The records desk (`shared.desk`): answers each person's asks with the jobs they may
read, from the `jobs` bucket and the event stream. Several submitter replicas answer as one
queue group; an ask that waits for news holds no consumer, only a wait on the job's events
as they happen."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import nats.errors
import structlog
from nats.aio.msg import Msg
from pydantic import ValidationError

from services.submitter import policy
from services.submitter.ports import JobStore, TeamsSource
from shared.cost import COST_EVENTS
from shared.desk import (
    Ask,
    DeskAnswer,
    DeskAsk,
    StoredEvent,
    asker,
    desk_subjects,
    hidden,
    page,
)
from shared.events import decode, encode, subjects_for
from shared.messaging.jetstream import JetStreamBus
from shared.messaging.ports import StoredMessage
from shared.teams import Teams

log = structlog.get_logger()

QUEUE_GROUP = "records-desk"
MOST_ASKS_AT_ONCE = 256
"""Asks answered at once; more wait their turn (a follower waits up to 20 s for news)."""

_JOB_COST_EVENTS = tuple(model for model in COST_EVENTS if model.aggregate == "job")


class RecordsDesk:
    def __init__(self, bus: JetStreamBus, store: JobStore, teams: TeamsSource | None) -> None:
        self._bus = bus
        self._store = store
        self._teams = teams
        self._news: dict[str, asyncio.Event] = {}
        self._answering = asyncio.Semaphore(MOST_ASKS_AT_ONCE)
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, stop: asyncio.Event) -> None:
        """Answer until `stop` is set; a `Watch` of the submitter's runtime."""
        prefix = self._bus.prefix
        asks = await self._bus.client.subscribe(
            desk_subjects(prefix), queue=QUEUE_GROUP, cb=self._on_ask
        )
        log.info("desk.open", subjects=desk_subjects(prefix))
        try:
            # News of the jobs' events, read from the stream as it stores them (a service
            # pulls; it never listens in), to wake the asks waiting for them.
            news = self._bus.follow([f"{prefix}.job.>"], stop)
            async with contextlib.aclosing(news) as records:
                async for record in records:
                    self._on_news(record.data)
        finally:
            with contextlib.suppress(nats.errors.Error):
                await asks.unsubscribe()
            for task in list(self._tasks):
                task.cancel()

    def _on_news(self, data: bytes) -> None:
        try:
            job_id = getattr(decode(data).data, "job_id", None)
        except ValueError:
            return
        if job_id is not None and (waiting := self._news.pop(job_id, None)) is not None:
            waiting.set()

    async def _on_ask(self, msg: Msg) -> None:
        # A callback holds up the next message until it returns: each ask is its own task,
        # so one that waits for news delays nobody.
        task = asyncio.create_task(self._answer(msg))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, msg: Msg) -> None:
        async with self._answering:
            reader = asker(msg.subject, self._bus.prefix)
            try:
                ask = DeskAsk.model_validate_json(msg.data)
            except ValidationError as error:
                problem = error.errors()[0]
                answer = DeskAnswer(refused=f"not an ask the desk knows: {problem['msg']}")
            else:
                if reader is None:
                    answer = DeskAnswer(refused="an ask names nobody")
                else:
                    try:
                        answer = await self._answer_ask(ask, reader)
                    except Exception:
                        log.exception("desk.failed", ask=ask.ask, reader=reader)
                        answer = DeskAnswer(refused="the records desk failed; see its log")
            if msg.reply:
                with contextlib.suppress(nats.errors.Error):
                    await msg.respond(answer.model_dump_json().encode())

    async def _answer_ask(self, ask: DeskAsk, reader: str) -> DeskAnswer:
        teams = self._teams.current() if self._teams is not None else None
        match ask.ask:
            case Ask.JOBS:
                return await self._jobs(ask, reader, teams)
            case Ask.JOB | Ask.HISTORY:
                if ask.job_id is None:
                    return DeskAnswer(refused=f"an ask for {ask.ask.value} names a job")
                found = await self._store.get(ask.job_id)
                if found is None or not policy.may_read(found[0], reader, teams):
                    return DeskAnswer()  # the same answer whether it is not there or not theirs
                record = found[0]
                if ask.ask is Ask.JOB:
                    may_cancel = policy.who_may_not_cancel(record, reader, teams) is None
                    return DeskAnswer(records=(record,), may_cancel=may_cancel)
                return await self._history(ask, record.job_id)
            case Ask.COST:
                return await self._cost(ask, reader, teams)

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
        subjects = subjects_for(_JOB_COST_EVENTS, self._bus.prefix)
        batches = await asyncio.gather(
            *(self._bus.read(subject, after_seq=ask.after_seq) for subject in subjects)
        )
        stored = sorted((m for batch in batches for m in batch), key=lambda m: m.seq)

        def shown(message: StoredMessage) -> StoredMessage:
            try:
                event = decode(message.data)
            except ValueError:
                return message
            job_id = getattr(event.data, "job_id", None)
            if job_id in readable:
                return message
            return StoredMessage(message.seq, message.subject, encode(hidden(event)), {})

        return _events_answer(
            [shown(m) for m in stored], scanned_to=_last_seq(stored, ask.after_seq)
        )


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
