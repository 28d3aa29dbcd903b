"""`spotrain demo`: a job request goes in, the submitter's answer comes out."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from rich.console import Console

from shared.cli.console import CliError
from shared.events import decode, new_event, new_event_id, subject_for
from shared.events.data import JobAccepted, JobRequested
from shared.messaging import BusSettings
from shared.messaging.jetstream import BusUnavailableError, JetStreamBus


async def run_demo(out: Console, *, timeout_s: float) -> None:
    settings = BusSettings(connect_timeout_s=2)
    try:
        bus = await JetStreamBus.connect(settings, name="spotrain-demo")
    except BusUnavailableError:
        msg = f"the stack is not running (no NATS at {settings.nats_url}); start it: spotrain up"
        raise CliError(msg) from None
    try:
        job_id = f"demo-{new_event_id()[:8]}"
        request = new_event(
            JobRequested(
                job_id=job_id,
                owner="demo",
                experiment="hello",
                entrypoint=("python", "-c", "print('hello from spotrain')"),
            ),
            source="cli/demo",
            time=datetime.now(UTC),
            subject=job_id,
        )
        started = time.perf_counter()
        ack = await bus.publish(request)
        out.print(f"published job.requested for [bold]{job_id}[/] (stream seq {ack.seq})")
        deadline = started + timeout_s
        while time.perf_counter() < deadline:
            for stored in await bus.read(subject_for(JobAccepted, bus.prefix)):
                event = decode(stored.data)
                if isinstance(event.data, JobAccepted) and event.data.job_id == job_id:
                    elapsed_ms = (time.perf_counter() - started) * 1000
                    out.print(
                        f"the submitter accepted [bold]{job_id}[/] in {elapsed_ms:.0f} ms "
                        f"(event {event.id} from {event.source})"
                    )
                    return
            await asyncio.sleep(0.2)
        msg = f"no job.accepted for {job_id} in {timeout_s:.0f}s; is the submitter up? (see status)"
        raise CliError(msg)
    finally:
        await bus.close()
