"""A secure local stack with people in it, for the adversarial suite and its benchmark:
alice (vision) attacks, bob (nlp) is the victim, with a job of his running or waiting and
a secret of his team's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from shared.messaging.jetstream import JetStreamBus
from tests.e2e.stack import spotrain, stack_env
from tests.security.attacks import Arena, bus_settings, load_env_file

TEAMS = """
[teams.vision]
members = ["alice"]
[teams.nlp]
members = ["bob"]
"""
BOBS_TEAM_SECRET = "nlp-hf-token-that-alice-must-not-get"  # noqa: S105  # a fake, to look for
VICTIM_JOB = "bobs-victim"


@dataclass(frozen=True)
class World:
    home: Path
    env: dict[str, str]
    people: dict[str, dict[str, str]]
    """Each person's environment (their credentials file), besides the stack's."""
    victim_job: str


def open_world(root: Path) -> World:
    """`spotrain up --secure` in `root`, its people added, bob's job submitted; `close_world`
    takes the stack down."""
    home = root / "stack"
    (root / "teams.toml").write_text(TEAMS)
    (root / "secrets" / "nlp").mkdir(parents=True)
    (root / "secrets" / "nlp" / "hf-token").write_text(BOBS_TEAM_SECRET)
    env = {
        **stack_env(home),
        "SPOTRAIN_SUBMITTER_TEAMS_FILE": str(root / "teams.toml"),
        "SPOTRAIN_SUBMITTER_SECRETS_DIR": str(root / "secrets"),
    }
    up = spotrain(env, "up", "--secure")
    if up.returncode != 0:
        spotrain(env, "down")
        raise RuntimeError(f"spotrain up --secure failed: {up.stderr}{up.stdout}")
    try:
        people = {}
        for name, team in (("alice", "vision"), ("bob", "nlp")):
            credentials = root / f"{name}.env"
            added = spotrain(env, "users", "add", name, "--team", team, "--out", str(credentials))
            if added.returncode != 0:
                raise RuntimeError(f"users add {name}: {added.stderr}{added.stdout}")
            people[name] = {**env, "SPOTRAIN_CREDENTIALS": str(credentials)}
        project = root / "project"
        project.mkdir()
        (project / "sleep.py").write_text("import time\ntime.sleep(900)\n")
        submitted = spotrain(
            people["bob"], "submit", "sleep.py", "--workdir", str(project),
            "--job-id", VICTIM_JOB, "--gpus", "0", "--cpus", "1",
        )  # fmt: skip
        if submitted.returncode != 0:
            raise RuntimeError(f"bob's job: {submitted.stderr}{submitted.stdout}")
    except BaseException:
        spotrain(env, "down")
        raise
    return World(home=home, env=env, people=people, victim_job=VICTIM_JOB)


def close_world(world: World) -> None:
    spotrain(world.env, "down")


@asynccontextmanager
async def arena_of(world: World) -> AsyncIterator[Arena]:
    """The world's people and ops, connected."""
    url = world.env["SPOTRAIN_NATS_URL"]
    async with AsyncExitStack() as stack:

        async def connect(env: dict[str, str], name: str) -> JetStreamBus:
            bus = await JetStreamBus.connect(bus_settings(env, url), name=name)
            stack.push_async_callback(bus.close)
            return bus

        people = {
            name: load_env_file(Path(env["SPOTRAIN_CREDENTIALS"]))
            for name, env in world.people.items()
        }
        ops = load_env_file(world.home / "nats-auth" / "ops.env")
        yield Arena(
            home=world.home,
            stack_env=world.env,
            alice=await connect(people["alice"], "alice"),
            bob=await connect(people["bob"], "bob"),
            ops=await connect(ops, "ops"),
            dashboard=f"http://127.0.0.1:{world.env['SPOTRAIN_LOCAL_RAY_DASHBOARD_PORT']}",
            agent_port=int(world.env["SPOTRAIN_LOCAL_RAY_HEAD_PORT_BASE"]) + 2,
            victim_job=world.victim_job,
        )
