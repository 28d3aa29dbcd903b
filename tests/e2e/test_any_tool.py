"""Any tool can submit: hand-written CloudEvents JSON, published with plain nats-py by a process
that imports nothing of spotrain, runs as a job to `job.succeeded`; and `docs/events.md` says
exactly how (its request matches the published JSON Schema, its Python example runs a job).

Nothing here imports spotrain: the stack comes from the `local_stack` fixture, and the bus is
read as an outside tool reads it, with nats-py and JSON.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import nats
import nats.js.errors
import pytest

ROOT = Path(__file__).parents[2]
DOC = ROOT / "docs/events.md"
SCHEMA = ROOT / "docs/events/schemas/spotrain.job.requested.v1.json"
TERMINAL = {
    "spotrain.job.succeeded.v1",
    "spotrain.job.failed.v1",
    "spotrain.job.cancelled.v1",
    "spotrain.job.rejected.v1",
}

# What an outside tool runs: a literal CloudEvent, published twice with its id as Nats-Msg-Id.
PUBLISHER = textwrap.dedent(
    """
    import asyncio, json, os, sys

    import nats


    async def main() -> None:
        job_id = sys.argv[1]
        event = {
            "specversion": "1.0",
            "id": f"req-{job_id}",
            "source": "any-tool/alice",
            "type": "spotrain.job.requested.v1",
            "time": "2026-01-01T12:00:00Z",
            "subject": job_id,
            "datacontenttype": "application/json",
            "data": {
                "job_id": job_id,
                "owner": "alice",
                "entrypoint": ["python", "-c", "print('hello from any tool')"],
                "worker": {"gpus": 1, "cpus": 1},
                "capacity": "spot",
                "labels": {"tool": "any"},
            },
        }
        nc = await nats.connect(os.environ["SPOTRAIN_NATS_URL"])
        js = nc.jetstream()
        body = json.dumps(event).encode()
        for _ in range(2):  # a retry after a lost ack: the same bytes, the same id
            ack = await js.publish(
                "spotrain.job.requested.alice", body, headers={"Nats-Msg-Id": event["id"]}
            )
            print(json.dumps({"seq": ack.seq, "duplicate": bool(ack.duplicate)}))
        await nc.close()
        ours = sorted(m for m in sys.modules if m.split(".")[0] in ("shared", "services", "tests"))
        print(json.dumps({"spotrain_modules": ours}))


    asyncio.run(main())
    """
)


def fenced(text: str, language: str) -> list[str]:
    """The bodies of the document's ```language blocks, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


async def run(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, list(argv), env=env, capture_output=True, text=True, timeout=60, check=False
    )


async def record_of(nc: Any, job_id: str) -> dict[str, Any] | None:
    """The job's record in the `spotrain-jobs` bucket, as the docs say to read it."""
    try:
        kv = await nc.jetstream().key_value("spotrain-jobs")
        entry = await kv.get(job_id)
    except (nats.js.errors.BucketNotFoundError, nats.js.errors.KeyNotFoundError):
        return None
    record: dict[str, Any] = json.loads(entry.value)
    return record


def test_the_documented_request_is_valid_against_its_published_json_schema() -> None:
    """The request in the docs, and the header and subject its `nats pub` line uses."""
    text = DOC.read_text()
    request = json.loads(fenced(text, "json")[0])
    jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text())).validate(request)
    nats_pub = next(line for line in fenced(text, "sh")[0].splitlines() if " pub " in line)
    owner = request["data"]["owner"]
    assert f"-H Nats-Msg-Id:{request['id']} spotrain.job.requested.{owner} " in nats_pub
    assert f"{request['data']['job_id']}.json" in nats_pub


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_hand_written_cloudevent_published_with_plain_nats_py_runs_the_job(
    local_stack: dict[str, str],
) -> None:
    job_id = f"any-tool-{uuid.uuid4().hex[:6]}"
    seen: list[str] = []
    ended = asyncio.Event()

    async def on_event(msg: Any) -> None:
        event = json.loads(msg.data)
        if event["data"].get("job_id") == job_id:
            seen.append(event["type"])
            if event["type"] in TERMINAL:
                ended.set()

    nc = await nats.connect(local_stack["SPOTRAIN_NATS_URL"])
    try:
        # Subscribed before publishing, as the docs say, so no event is missed.
        sub = await nc.subscribe("spotrain.job.>", cb=on_event)
        published = await run(sys.executable, "-c", PUBLISHER, job_id, env=local_stack)
        assert published.returncode == 0, published.stderr
        first, second, modules = map(json.loads, published.stdout.splitlines())
        assert modules == {"spotrain_modules": []}, "the publisher imported spotrain"
        assert first["duplicate"] is False
        assert second == {"seq": first["seq"], "duplicate": True}, "stored once"

        await asyncio.wait_for(ended.wait(), timeout=60)
        await sub.unsubscribe()
        record = await record_of(nc, job_id)
    finally:
        await nc.close()

    assert seen[-1] == "spotrain.job.succeeded.v1", seen
    for kind in ("accepted", "queued", "started"):
        assert seen.count(f"spotrain.job.{kind}.v1") == 1, seen
    assert seen.index("spotrain.job.accepted.v1") < seen.index("spotrain.job.started.v1")
    assert record is not None
    assert record["request"]["owner"] == "alice"
    assert record["request"]["labels"] == {"tool": "any"}


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_python_example_in_the_docs_runs_a_job_followed_in_the_jobs_bucket(
    local_stack: dict[str, str], tmp_path: Path
) -> None:
    example = fenced(DOC.read_text(), "python")[0]
    assert "nats://127.0.0.1:4222" in example
    script = tmp_path / "example.py"
    script.write_text(example.replace("nats://127.0.0.1:4222", local_stack["SPOTRAIN_NATS_URL"]))
    published = await run(sys.executable, str(script), env=local_stack)
    assert published.returncode == 0, published.stderr
    job_id = published.stdout.split()[0]
    assert "stored as" in published.stdout

    nc = await nats.connect(local_stack["SPOTRAIN_NATS_URL"])
    try:
        deadline = time.monotonic() + 60
        record = await record_of(nc, job_id)
        while record is None or record["state"] not in ("succeeded", "failed", "rejected"):
            assert time.monotonic() < deadline, record
            await asyncio.sleep(0.5)
            record = await record_of(nc, job_id)
    finally:
        await nc.close()
    assert record["state"] == "succeeded", record
    assert record["attempts"][-1]["state"] == "succeeded"
