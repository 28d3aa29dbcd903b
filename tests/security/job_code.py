"""Job code against the stack that runs it: a job of alice's looks for what the secure
stack keeps (every role's NATS credentials, the NATS store, bob's team's secret, the
submitter's process) and tries to change the platform's code; for the adversarial suite
and its benchmark."""

from __future__ import annotations

import json
from pathlib import Path

import shared
from shared.localstack.processes import ProcessRecord
from shared.localstack.settings import LocalStackSettings
from tests.e2e.stack import spotrain
from tests.security.world import World

SNOOP = """
import json, os, pathlib, sys
tries = json.loads(sys.argv[1])
seen = {}
for name, path in tries["read"].items():
    try:
        p = pathlib.Path(path)
        seen[name] = sorted(os.listdir(p)) if p.is_dir() else p.read_text()[:40]
    except OSError as error:
        seen[name] = f"refused {type(error).__name__}"
for name, path in tries["write"].items():
    try:
        pathlib.Path(path).write_text("a job was here")
        seen[name] = "written"
    except OSError as error:
        seen[name] = f"refused {type(error).__name__}"
print("seen:", json.dumps(seen, sort_keys=True))
"""


def snoop(world: World, scratch: Path) -> dict[str, object]:
    """What alice's job saw of each thing it tried (`refused` says which it did not get);
    whatever it planted in the platform's code is taken out again."""
    submitter = ProcessRecord.load(world.home / "run" / "submitter.json")
    assert submitter is not None
    project = Path(shared.__file__).resolve().parent.parent
    planted = project / "shared" / "planted_by_a_job.py"
    settings = LocalStackSettings(home=world.home)
    tries = {
        "read": {
            "credentials": str(world.home / "nats-auth"),
            "nats-store": str(world.home / "nats"),
            "team-secret": world.env["SPOTRAIN_SUBMITTER_SECRETS_DIR"] + "/nlp/hf-token",
            "submitter-env": f"/proc/{submitter.pid}/environ",
            "submitter-root": f"/proc/{submitter.pid}/root/",
        },
        "write": {
            "platform-code": str(planted),
            "checkpoints": str(settings.checkpoint_dir / "alice-snoop" / "mine.txt"),
        },
    }
    workdir = scratch / "snoop"
    workdir.mkdir()
    (workdir / "snoop.py").write_text(SNOOP)
    (settings.checkpoint_dir / "alice-snoop").mkdir(parents=True, exist_ok=True)
    try:
        submitted = spotrain(
            world.people["alice"], "submit", "snoop.py", "--workdir", str(workdir),
            "--job-id", "alice-snoop", "--gpus", "0", "--cpus", "1", "--wait",
            "--", json.dumps(tries), timeout_s=240,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr + submitted.stdout
    finally:
        planted.unlink(missing_ok=True)
    logs = spotrain(world.people["alice"], "logs", "alice-snoop")
    [line] = [line for line in logs.stdout.splitlines() if line.startswith("seen: ")]
    seen: dict[str, object] = json.loads(line.removeprefix("seen: "))
    return seen


def refused(what: object) -> bool:
    """Refused outright, or shown an empty folder in place of the stack's."""
    return what == [] or (isinstance(what, str) and what.startswith("refused "))
