"""Running the `spotrain` command as users do: its own process, its real entry point."""

from __future__ import annotations

import os
import subprocess
import sys

from shared.localstack.ports import free_port

ENTRY = "from shared.cli.entry import main; main()"


def spotrain(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The command's result; a wide terminal, so tables are not cut."""
    return subprocess.run(
        [sys.executable, "-c", ENTRY, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        timeout=60,
        check=False,
    )


def no_bus() -> dict[str, str]:
    """An environment pointing at a NATS URL where nothing listens."""
    return {"SPOTRAIN_NATS_URL": f"nats://127.0.0.1:{free_port()}"}
