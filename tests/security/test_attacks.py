"""Issue 32's attacks on the secure stack, each against a real nats-server and real Ray:
each is refused, and bob's job and secret come to no harm."""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.request
from pathlib import Path

import pytest

from shared.jobs import JobState
from shared.localstack.confinement import can_confine
from shared.localstack.processes import ProcessRecord, session_processes
from shared.localstack.settings import LocalStackSettings
from shared.workspace import workspaces_bucket
from tests.e2e.stack import spotrain
from tests.security.attacks import ATTACKS, PREFIX, Arena, Attack
from tests.security.job_code import refused, snoop
from tests.security.world import BOBS_TEAM_SECRET, World

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
async def test_the_attack_is_refused(arena: Arena, attack: Attack) -> None:
    assert not await attack.run(arena), f"{attack.kind}: {attack.name} got through"


async def test_the_victims_job_is_untouched(arena: Arena, world: World) -> None:
    for attack in ATTACKS:
        if attack.kind in ("reply_route", "consumers"):
            await attack.run(arena)
    record = await arena.client(arena.bob, "bob").job(world.victim_job)
    assert record is not None
    assert record.request.owner == "bob"
    assert not record.cancel_requested
    assert record.state in (JobState.QUEUED, JobState.RUNNING), record.state
    # The bus holds no event that carries bob's team secret.
    stored = await arena.ops.read(f"{PREFIX}.>")
    assert all(BOBS_TEAM_SECRET.encode() not in m.data for m in stored)


async def test_the_workspace_store_was_declared_by_the_platform_at_start(arena: Arena) -> None:
    """Before anyone uploaded, the store is there, as the submitter declared it: nobody
    could have made one of their own first."""
    info = await arena.ops.client.jetstream().stream_info(f"OBJ_{workspaces_bucket(PREFIX)}")
    assert info.config.sources is None or info.config.sources == []
    assert info.config.mirror is None


@pytest.mark.parametrize(
    "name",
    ["direct-get-into-bobs-subject", "read-the-jobs-bucket", "list-the-streams",
     "tail-the-job-events"],
)  # fmt: skip
async def test_a_probe_sees_a_route_that_is_open(arena: Arena, name: str) -> None:
    """The same probe, run with the operators' credential (the whole JetStream API): it
    reports the route open, so its silence for a person means a refusal."""
    [attack] = [a for a in ATTACKS if a.name == name]
    as_ops = dataclasses.replace(arena, alice=arena.ops)
    assert await attack.run(as_ops), f"{name} saw no route even for ops"


def test_the_ray_api_answers_its_token(world: World) -> None:
    """What the Ray probes are refused, the token's holder (the submitter) is given: the
    refusal is the token's doing."""
    token = (world.home / "ray-auth" / "token").read_text().strip()
    dashboard = f"http://127.0.0.1:{world.env['SPOTRAIN_LOCAL_RAY_DASHBOARD_PORT']}"
    request = urllib.request.Request(  # noqa: S310  # the stack's own Ray
        f"{dashboard}/api/jobs/", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
        assert response.status == 200
        assert isinstance(json.load(response), list)


def test_rays_logs_are_the_stacks_users_alone(world: World) -> None:
    """Ray's runtime-env agent logs what jobs are given (their environments, secrets
    included): on a secure stack no file of Ray's session is readable by others."""
    settings = LocalStackSettings(home=world.home)
    logs = settings.ray_temp_dir / "session_latest" / "logs"
    files = [p for p in logs.rglob("*") if p.is_file() and not p.is_symlink()]
    assert files, f"no Ray logs under {logs}"
    readable = [str(p) for p in files if p.stat().st_mode & 0o077]
    assert readable == []


@pytest.mark.parametrize(
    ("name", "team", "says"),
    [
        pytest.param("carol", "vision", "puts carol in no team", id="not-in-the-teams-file"),
        pytest.param("alice2", "nlp", "puts alice2 in no team", id="a-stranger"),
        pytest.param("bob", "vision", "puts bob in team nlp, not vision", id="another-team"),
    ],
)
def test_a_credential_agrees_with_the_teams_file_or_is_refused(
    world: World, tmp_path: Path, name: str, team: str, says: str
) -> None:
    out = tmp_path / f"{name}.env"
    added = spotrain(world.env, "users", "add", name, "--team", team, "--out", str(out))
    assert added.returncode == 2, added.stdout
    [line] = added.stderr.strip().splitlines()
    assert line.startswith("spotrain: error: spotrain users add: the teams file ")
    assert says in line
    assert not out.exists()


def test_job_code_finds_no_platform_credential_in_its_environment(
    world: World, tmp_path: Path
) -> None:
    """A job of bob's looks for credentials where it runs: its environment holds none of
    the platform's (the scaler that started its node holds its own NATS password)."""
    project = tmp_path / "snoop"
    project.mkdir()
    (project / "snoop.py").write_text(
        "import os\n"
        "keys = ('PASSWORD', 'NATS_USER', 'NATS_CREDS', 'CREDENTIALS', 'BOT_TOKEN')\n"
        "found = sorted(k for k in os.environ if any(key in k for key in keys))\n"
        "print('found:', ','.join(found) or 'nothing')\n"
    )
    submitted = spotrain(
        world.people["bob"], "submit", "snoop.py", "--workdir", str(project),
        "--job-id", "bob-snoop", "--gpus", "0", "--cpus", "1", "--wait", timeout_s=240,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr + submitted.stdout
    logs = spotrain(world.people["bob"], "logs", "bob-snoop")
    assert logs.returncode == 0, logs.stderr
    assert "found: nothing" in logs.stdout, logs.stdout


@pytest.mark.skipif(not can_confine(), reason="confining job code takes root and unshare")
def test_job_code_cannot_read_the_stacks_files_nor_change_its_code(
    world: World, tmp_path: Path
) -> None:
    """Alice's job, on a node of the secure stack, looks for what the stack keeps: every
    role's NATS credentials, the NATS store, bob's team's secret, the submitter's process
    (its environment), and tries to change the platform's code. All of it is out of reach,
    while its own checkpoint folder is still its own to write."""
    seen = snoop(world, tmp_path)
    assert seen.pop("checkpoints") == "written"
    assert {name: what for name, what in seen.items() if not refused(what)} == {}
    assert (world.home / "nats-auth" / "nats-server.conf").is_file()  # there, but hidden


@pytest.mark.skipif(not can_confine(), reason="confining job code takes root and unshare")
def test_every_ray_process_runs_confined(world: World) -> None:
    """The head (where multi-node jobs' drivers run) and every pool node: each of their
    processes, and so each job's, has no capability and a mount namespace of its own.
    Only a node's keeper, which never runs job code, stays outside."""
    settings = LocalStackSettings(home=world.home)
    head = ProcessRecord.load(settings.run_dir / "ray-head.json")
    deadline = time.monotonic() + 180
    while not (nodes := [ProcessRecord.load(p) for p in settings.node_dir.glob("*.json")]):
        assert time.monotonic() < deadline, "no pool node came up for bob's job"
        time.sleep(0.5)
    records = [record for record in (head, *nodes) if record is not None]
    assert head is not None
    assert len(records) >= 2, "the head and a pool node"
    ours = str(Path("/proc/self/ns/mnt").readlink())
    seen = {
        pid: view
        for record in records
        for pid in session_processes(record.pid)
        if (view := _view_of(pid)) is not None and "node_keeper" not in view[2]
    }
    assert len(seen) >= 2 * len(records)  # each node's gcs or raylet and agents, at least
    loose = {pid: view for pid, view in seen.items() if view[0] != 0 or view[1] == ours}
    assert loose == {}


def _view_of(pid: int) -> tuple[int, str, str] | None:
    """A process's effective capabilities, mount namespace and command line; None once
    it is gone (a job's workers come and go)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        namespace = str(Path(f"/proc/{pid}/ns/mnt").readlink())
        command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return None
    [line] = [line for line in status.splitlines() if line.startswith("CapEff:")]
    return int(line.split()[1], 16), namespace, command
