"""The `spotrain` console script: start fast, then hand over to the commands."""

from __future__ import annotations

import os
import sys


def main() -> None:
    # nats-py imports aiohttp, when it is installed (Ray brings it), only to offer ws://
    # URLs; that import is a third of the CLI's start-up. The CLI speaks nats:// and tls://.
    if not os.environ.get("SPOTRAIN_NATS_URL", "").startswith(("ws://", "wss://")):
        sys.modules.setdefault("aiohttp", None)  # type: ignore[arg-type]
    from shared.cli.app import main as run_command  # noqa: PLC0415  # after the line above

    run_command()
