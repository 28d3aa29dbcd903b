"""The root command lists every command without importing it, and builds the real one."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from shared.cli.app import COMMANDS, ListedCommand, build_command
from shared.cli.entry import exit_status


def test_the_listing_names_every_command_its_modules_register_and_no_other() -> None:
    registered: set[str] = set()
    for module in {c.module for c in COMMANDS}:
        holder = typer.Typer()
        importlib.import_module(module).register(holder)
        registered |= set(typer.main.get_group(holder).commands)
    assert registered == {c.name for c in COMMANDS}


@pytest.mark.parametrize("listed", COMMANDS, ids=lambda c: c.name)
def test_a_listed_command_builds_with_its_panel(listed: ListedCommand) -> None:
    command = build_command(listed)
    assert command.name == listed.name
    assert getattr(command, "rich_help_panel", None) == listed.panel
    assert len(listed.summary) <= 50, "one line beside the name at 80 columns"


HEAVY = ("nats", "shared.client", "shared.events", "shared.policy.cost", "pydantic_settings", "ray")


@pytest.mark.parametrize(
    ("args", "loaded", "not_loaded"),
    [
        pytest.param(["--help"], (), (*HEAVY, "shared.cli.jobs"), id="help"),
        # A command's own help imports its module, not the others'.
        pytest.param(
            ["preempt", "--help"],
            ("shared.cli.local",),
            ("shared.cli.jobs", "shared.client", "ray"),
            id="a-commands-help",
        ),
    ],
)
def test_help_imports_only_what_it_shows(
    args: list[str], loaded: tuple[str, ...], not_loaded: tuple[str, ...]
) -> None:
    probe = (
        "import sys\n"
        "from shared.cli.app import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('shared', 'nats', 'pydantic_settings', 'ray')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    modules = set(ast.literal_eval(result.stdout.strip().splitlines()[-1]))
    assert set(loaded) <= modules
    assert not modules & set(not_loaded), sorted(modules & set(not_loaded))


def test_an_unknown_command_is_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "from shared.cli.entry import main; main()", "lss"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[0].startswith("spotrain: error: No such command")


@pytest.mark.parametrize(
    ("words", "cword", "expected"),
    [
        pytest.param("spotrain pre", 1, ["preempt"], id="a-command"),
        # A lazy command's options complete: completion builds it as running it would.
        pytest.param("spotrain ls --", 2, ["--all", "--output", "--help"], id="its-options"),
    ],
)
def test_shell_completion_reaches_lazy_commands(
    words: str, cword: int, expected: list[str]
) -> None:
    # Completion is keyed by the program's name: the console script's.
    result = subprocess.run(
        [str(Path(sys.executable).parent / "spotrain")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={
            **os.environ,
            "_SPOTRAIN_COMPLETE": "complete_bash",
            "COMP_WORDS": words,
            "COMP_CWORD": str(cword),
        },
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == expected


# What the bus client of a job command does without: the services' logging and metrics,
# the permission table, Ray and the cloud clients. Each was a tenth of `spotrain submit`.
SERVICES_ONLY = ("structlog", "prometheus_client", "shared.natsauth", "ray", "google", "aiohttp")


def test_a_job_command_imports_none_of_what_only_the_services_use() -> None:
    probe = (
        "import sys\n"
        "sys.modules['aiohttp'] = None  # as the entry point does for a nats:// URL\n"
        "import shared.cli.app, shared.cli.job_actions\n"
        "print(sorted({m.split('.')[0] for m in sys.modules if sys.modules[m] is not None}"
        " | {m for m in sys.modules if m.startswith('shared.')}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    modules = set(ast.literal_eval(result.stdout.strip().splitlines()[-1]))
    assert "nats" in modules
    assert "shared.client" in modules
    assert not modules & set(SERVICES_ONLY), sorted(modules & set(SERVICES_ONLY))


@pytest.mark.parametrize(
    ("code", "status"),
    [(None, 0), (0, 0), (2, 2), ("spotrain: error: a message", 1)],
)
def test_the_exit_status_is_pythons(code: object, status: int) -> None:
    assert exit_status(code) == status


def test_exit_now_waits_for_a_thread_at_work_and_runs_the_exit_handlers(tmp_path: Path) -> None:
    probe = (
        "import atexit, threading, time, pathlib, sys\n"
        "from shared.cli.entry import exit_now\n"
        f"out = pathlib.Path({str(tmp_path)!r})\n"
        "atexit.register(lambda: (out / 'handler').write_text('ran'))\n"
        "def work():\n"
        "    time.sleep(0.3)\n"
        "    (out / 'thread').write_text('done')\n"
        "threading.Thread(target=work).start()\n"
        "print('buffered', end='')\n"
        "exit_now(3)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 3
    assert result.stdout == "buffered"
    assert (tmp_path / "thread").read_text() == "done"
    assert (tmp_path / "handler").read_text() == "ran"


def test_exit_now_flushes_what_was_printed_and_runs_the_exit_handlers(tmp_path: Path) -> None:
    probe = (
        "import atexit, pathlib, sys\n"
        "from shared.cli.entry import exit_now\n"
        f"out = pathlib.Path({str(tmp_path)!r})\n"
        "atexit.register(lambda: (out / 'handler').write_text('ran'))\n"
        "sys.stdout.write('x' * 100_000)\n"
        "exit_now(4)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 4
    assert result.stdout == "x" * 100_000
    assert (tmp_path / "handler").read_text() == "ran"


def test_collection_resumes_after_the_start() -> None:
    probe = (
        "import gc, time\n"
        "from shared.cli.entry import defer_collection\n"
        "defer_collection(0.2)\n"
        "first = gc.isenabled()\n"
        "time.sleep(1)\n"
        "print(first, gc.isenabled())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.split() == ["False", "True"]


def test_a_bus_that_does_not_answer_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import nats.errors  # noqa: PLC0415

    import shared.cli.app as cli_app  # noqa: PLC0415

    def no_answer(**_: object) -> None:
        raise nats.errors.TimeoutError

    monkeypatch.setattr(cli_app, "app", no_answer)
    with pytest.raises(SystemExit) as done:
        cli_app.main(["ls"])
    assert done.value.code == 1
    assert capsys.readouterr().err.splitlines() == [
        f"spotrain: error: {cli_app.BUS_DID_NOT_ANSWER}"
    ]
