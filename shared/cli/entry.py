"""The `spotrain` console script: start fast, then hand over to the commands."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
import threading
from typing import NoReturn

COLLECTION_DEFERRED_S = 1.0


def main() -> NoReturn:
    defer_collection(COLLECTION_DEFERRED_S)
    # nats-py imports aiohttp, when it is installed (Ray brings it), only to offer ws://
    # URLs; that import is a third of the CLI's start-up. The CLI speaks nats:// and tls://.
    if not os.environ.get("SPOTRAIN_NATS_URL", "").startswith(("ws://", "wss://")):
        sys.modules.setdefault("aiohttp", None)  # type: ignore[arg-type]
    from pydantic import ValidationError  # noqa: PLC0415  # imported by the commands anyway

    from shared.cli.app import main as run_command  # noqa: PLC0415  # after the line above
    from shared.setting_errors import is_settings_error, setting_error_line  # noqa: PLC0415

    try:
        run_command()
    except SystemExit as done:
        code = exit_status(done.code)
    except ValidationError as error:
        if not is_settings_error(error):
            raise
        # A setting read from the environment is wrong: which one, in one line.
        print(f"spotrain: error: {setting_error_line(error)}", file=sys.stderr)
        code = 2
    else:
        code = 0
    exit_now(code)


def defer_collection(seconds: float) -> None:
    """No garbage collection for the first `seconds`. Start-up allocates a few hundred
    thousand objects (the event models, the bus client, rich's styles), none of them
    garbage, and the collector's passes over them are a tenth of a short command. It
    resumes after, for the commands that stay (watch, top, logs --follow)."""
    gc.disable()
    resume = threading.Timer(seconds, gc.enable)
    resume.daemon = True
    resume.start()


def exit_status(code: object) -> int:
    """What the shell gets for `sys.exit(code)`, as Python itself decides it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def exit_now(code: int) -> NoReturn:
    """Exit without Python's teardown, which frees every object of the process one by one:
    a tenth of a short command, for what the OS does at once. The exit handlers still run
    and the output is flushed; a thread still at work gets the usual, waiting exit."""
    working = [
        thread
        for thread in threading.enumerate()
        if thread is not threading.main_thread() and not thread.daemon
    ]
    if working:
        sys.exit(code)
    atexit._run_exitfuncs()  # what Python would run before its teardown
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`| head`) or stream
            stream.flush()
    os._exit(code)
