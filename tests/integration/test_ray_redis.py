"""The check that a Redis can keep a Ray head's state, against a real redis-server (Debian's,
installed by tools/install-redis): it answers with the password, refuses a wrong one, wants
one, or is not there."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.localstack.ports import free_port
from shared.localstack.redis import find_binary
from shared.localstack.settings import LocalStackSettings
from shared.ray_head import redis_refusal

PASSWORD = "right-one"  # noqa: S105  # the test Redis's own


@pytest.fixture(scope="module")
def redis_at() -> Iterator[str]:
    binary = find_binary(LocalStackSettings())
    if binary is None:
        pytest.fail("no redis-server: run tools/install-redis .tools/bin (make test does)")
    port = free_port()
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", PASSWORD,
         "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_a_redis_that_takes_the_password_is_fit(redis_at: str) -> None:
    assert redis_refusal(redis_at, PASSWORD) is None


@pytest.mark.parametrize(
    ("password", "why"),
    [
        pytest.param("wrong", "refuses the password", id="wrong-password"),
        pytest.param("", "wants a password", id="no-password"),
    ],
)
def test_a_redis_that_refuses_says_so(redis_at: str, password: str, why: str) -> None:
    refusal = redis_refusal(redis_at, password)
    assert refusal == f"the Redis at {redis_at} {why}" + (
        " (SPOTRAIN_LOCAL_RAY_REDIS_PASSWORD)" if not password else ""
    )


def test_nothing_there_is_named(tmp_path: Path) -> None:
    at = f"127.0.0.1:{free_port()}"
    refusal = redis_refusal(at, PASSWORD)
    assert refusal is not None
    assert refusal.startswith(f"nothing answers as Redis at {at}")


@pytest.mark.parametrize(
    ("password", "code", "said"),
    [
        pytest.param(PASSWORD, 0, "answers: the head can keep its state there", id="fit"),
        pytest.param("wrong", 1, "ray fault tolerance: the Redis at", id="refused"),
    ],
)
def test_the_charts_check_says_it_in_one_line(
    redis_at: str, password: str, code: int, said: str
) -> None:
    env = {
        **os.environ,
        "SPOTRAIN_RAY_REDIS_ADDRESS": redis_at,
        "SPOTRAIN_RAY_REDIS_PASSWORD": password,
    }
    done = subprocess.run(
        [sys.executable, "-m", "shared.ray_head", "check-redis"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == code
    [line] = (done.stdout + done.stderr).splitlines()
    assert said in line
