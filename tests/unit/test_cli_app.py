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


HEAVY = ("nats", "shared.client", "shared.events", "shared.cost", "pydantic_settings", "ray")


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
