"""`spotrain up --secure`: every component on its own NATS user, and a job still runs."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.localstack.ports import free_port
from shared.localstack.settings import LocalStackSettings
from tests.e2e.stack import spotrain, stack_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


SIGNED_IN = "X-Auth-Request-User"


@contextlib.contextmanager
def page_behind_sign_in(env: dict[str, str]) -> Iterator[str]:
    """The page's process with its role's credential (`ui`), taking the person from the
    header a sign-in proxy sets; its address."""
    port = free_port()
    page = subprocess.Popen(
        [sys.executable, "-m", "shared.ui"],
        env={**env, "SPOTRAIN_UI_HTTP_PORT": str(port), "SPOTRAIN_UI_VIEWER_HEADER": SIGNED_IN},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/healthz", timeout=1).close()  # noqa: S310  # ours
                break
            except OSError:
                assert page.poll() is None, "the page's process ended"
                assert time.monotonic() < deadline, "the page never served"
                time.sleep(0.2)
        yield url
    finally:
        page.terminate()
        page.wait(10)


def read_page(url: str, person: str | None) -> str:
    headers = {SIGNED_IN: person} if person is not None else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310  # ours
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310  # ours
        return str(response.read().decode())


def status_of(url: str, person: str | None) -> int:
    try:
        read_page(url, person)
    except urllib.error.HTTPError as error:
        error.close()
        return error.code
    return 200


def load_env_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip().strip("'\"") for key, value in pairs}


@pytest.fixture
def secure_stack(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = stack_env(tmp_path / "stack")
    up = spotrain(env, "up", "--secure")
    assert up.returncode == 0, up.stderr + up.stdout
    assert "secure bus" in up.stdout
    yield env
    spotrain(env, "down")
    # Ray's session, logs and all (what jobs were given), is not kept once it is down.
    ray_temp = LocalStackSettings(home=Path(env["SPOTRAIN_LOCAL_HOME"])).ray_temp_dir
    assert not ray_temp.exists(), ray_temp


def test_a_job_runs_on_a_secure_stack_and_an_anonymous_client_is_refused(
    secure_stack: dict[str, str], tmp_path: Path
) -> None:
    home = Path(secure_stack["SPOTRAIN_LOCAL_HOME"])
    anonymous = spotrain(secure_stack, "ls")
    assert anonymous.returncode == 1
    assert anonymous.stderr.startswith("spotrain: error: ")
    assert len(anonymous.stderr.strip().splitlines()) == 1, anonymous.stderr

    cli = {**secure_stack, **load_env_file(home / "nats-auth" / "cli.env")}
    project = tmp_path / "project"
    project.mkdir()
    (project / "hello.py").write_text("print('hello from a secure stack')\n")
    submitted = spotrain(
        cli,
        "submit",
        "hello.py",
        "--workdir",
        str(project),
        "--job-id",
        "secure-1",
        "--wait",
        timeout_s=180,
    )
    assert submitted.returncode == 0, submitted.stderr + submitted.stdout
    assert "succeeded" in submitted.stderr + submitted.stdout
    listed = spotrain({**cli, "COLUMNS": "200"}, "ls")
    assert listed.returncode == 0, listed.stderr
    assert "secure-1" in listed.stdout

    # People with credentials of their own: what alice submits is hers, proven by the
    # server; bob can neither read it nor cancel it.
    keys = {}
    for name, team in (("alice", "vision"), ("bob", "nlp")):
        keys[name] = tmp_path / f"{name}.env"
        added = spotrain(
            secure_stack, "users", "add", name, "--team", team, "--out", str(keys[name])
        )
        assert added.returncode == 0, added.stderr + added.stdout
        assert f"export SPOTRAIN_CREDENTIALS={keys[name]}" in added.stdout
        assert keys[name].stat().st_mode & 0o077 == 0
    alice = {**secure_stack, "SPOTRAIN_CREDENTIALS": str(keys["alice"])}
    bob = {**secure_stack, "SPOTRAIN_CREDENTIALS": str(keys["bob"])}
    submitted = spotrain(
        alice, "submit", "hello.py", "--workdir", str(project), "--job-id", "alice-1", "--wait",
        timeout_s=180,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr + submitted.stdout
    assert "succeeded" in submitted.stderr + submitted.stdout  # followed through the desk
    # Each reads their own jobs (and their team's) through the submitter's records desk;
    # another team's job is not there for them, as if it never was.
    mine = spotrain({**alice, "COLUMNS": "200"}, "ls")
    assert mine.returncode == 0, mine.stderr
    assert "alice-1" in mine.stdout
    assert "secure-1" not in mine.stdout
    theirs = spotrain({**bob, "COLUMNS": "200"}, "ls")
    assert theirs.returncode == 0, theirs.stderr
    assert "alice-1" not in theirs.stdout
    shown = spotrain({**bob, "COLUMNS": "200"}, "show", "alice-1")
    assert shown.returncode == 1
    assert shown.stderr.strip() == "spotrain: error: no job alice-1"
    refused = spotrain(bob, "cancel", "alice-1")
    assert refused.returncode == 1
    assert refused.stderr.strip() == "spotrain: error: no job alice-1"
    # The web page as the chart runs it behind a sign-in: each person's page shows their
    # own jobs (and their team's), never another's, whatever address they try.
    ui = {**secure_stack, **load_env_file(home / "nats-auth" / "ui.env")}
    with page_behind_sign_in(ui) as url:
        alices = read_page(f"{url}/jobs", "alice")
        assert 'data-job="alice-1"' in alices
        assert "secure-1" not in alices
        bobs = read_page(f"{url}/jobs", "bob")
        assert "alice-1" not in bobs
        assert 'data-matching="0"' in bobs
        assert status_of(f"{url}/jobs/alice-1", "bob") == 404
        assert status_of(f"{url}/jobs/alice-1", "alice") == 200
        assert status_of(f"{url}/jobs", None) == 401

    taken = spotrain(
        secure_stack, "users", "add", "cli", "--team", "x", "--out", str(tmp_path / "x")
    )
    assert taken.returncode == 2
    assert len(taken.stderr.strip().splitlines()) == 1, taken.stderr
    assert "a service's or a client role's name" in taken.stderr
