"""The process the platform runs for every attempt, in front of the user's command:
`python -m shared.usercode.launch -- ARGV...`.

It gives the command what a script written for no platform needs to survive a spot VM:
- SPOTRAIN_CHECKPOINT_DIR, a local folder holding the latest files the job saved there,
  kept in the job's checkpoint store while it runs (`checkpoint_dir`);
- the node's preemption notice as SIGTERM, as Kubernetes gives a pod, with the notice's
  time to save (the platform's CHECKPOINT_NOW request for this attempt);
- Ray Train's defaults for where the run's checkpoints live, its name and its workers'
  capacity (`ray_train_defaults`, armed in every Python process of the command);
- its output kept beside its checkpoints (the last `KEPT_LOG_BYTES`, as often as the
  folder is synced): readable after Ray lost it with its head or its node.
It exits as the command did (128 + N for a signal); after a notice, never 0, since the
attempt was cut short.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Final

from shared.checkpoints import (
    KEPT_LOG_BYTES,
    CheckpointStorage,
    checkpoint_request_applies,
    read_checkpoint_request,
    storage_for,
    write_attempt_log,
)
from shared.training import TrainingEnvironment, TrainingEnvironmentError
from shared.usercode import bootstrap
from shared.usercode.checkpoint_dir import CheckpointFolder, default_folder

ENV_CHECKPOINT_DIR: Final = "SPOTRAIN_CHECKPOINT_DIR"
ENV_SYNC_S: Final = "SPOTRAIN_CHECKPOINT_SYNC_S"
EXIT_TERMINATED: Final = 128 + signal.SIGTERM
EXIT_USAGE: Final = 2
BOOTSTRAP_FOLDER: Final = str(Path(bootstrap.__file__).parent)


def _say(message: str) -> None:
    print(f"spotrain: {message}", file=sys.stderr, flush=True)


PROGRESS_CALLBACK: Final = "shared.usercode.ray_train_progress.ReportsAsProgress"


def child_environment(environ: Mapping[str, str], folder: Path) -> dict[str, str]:
    """The command's environment: the folder, the bootstrap first on PYTHONPATH, and Ray
    Train's reports as the job's progress (beside any callbacks the job names itself)."""
    paths = [BOOTSTRAP_FOLDER, *filter(None, environ.get("PYTHONPATH", "").split(os.pathsep))]
    callbacks = [
        *filter(None, environ.get("RAY_TRAIN_CALLBACKS", "").split(",")),
        PROGRESS_CALLBACK,
    ]
    return {
        **environ,
        ENV_CHECKPOINT_DIR: str(folder),
        "PYTHONPATH": os.pathsep.join(paths),
        "RAY_TRAIN_CALLBACKS": ",".join(callbacks),
    }


def exit_code(returncode: int, *, noticed: bool) -> int:
    """The launcher's exit status for the command's `returncode` (negative: killed by that
    signal). Pure."""
    code = 128 - returncode if returncode < 0 else returncode
    return EXIT_TERMINATED if noticed and code == 0 else code


class KeptOutput:
    """The command's output (stdout and stderr as one stream, as Ray keeps it), passed on
    as it comes, its end held to be kept in the job's store."""

    def __init__(self, source: IO[bytes], sink: IO[bytes]) -> None:
        self._source, self._sink = source, sink
        self._tail = bytearray()
        self._lock = threading.Lock()
        self.version = 0
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while chunk := os.read(self._source.fileno(), 65536):
            self._sink.write(chunk)
            self._sink.flush()
            with self._lock:
                self._tail += chunk
                if len(self._tail) > 2 * KEPT_LOG_BYTES:
                    del self._tail[:-KEPT_LOG_BYTES]
                self.version += 1

    def finish(self, timeout_s: float = 5.0) -> None:
        """Wait for what the command printed last (its pipe closes when it ends)."""
        self._thread.join(timeout=timeout_s)

    def snapshot(self) -> tuple[int, bytes]:
        with self._lock:
            return self.version, bytes(self._tail[-KEPT_LOG_BYTES:])


@dataclass
class Supervision:
    """One attempt's command, watched: the notice, the folder's syncs, its end."""

    environment: TrainingEnvironment
    folder: CheckpointFolder
    child: subprocess.Popen[bytes]
    poll_s: float
    sync_s: float
    output: KeptOutput | None = None
    storage: CheckpointStorage | None = None
    noticed: bool = False
    next_sync: float = field(default=0.0)
    kept_version: int = 0

    def run(self) -> int:
        self.next_sync = time.monotonic() + self.sync_s
        while True:
            try:
                returncode = self.child.wait(timeout=self.poll_s)
            except subprocess.TimeoutExpired:
                self._watch()
                continue
            if self.output is not None:
                self.output.finish()
            self._sync(final=True)
            return exit_code(returncode, noticed=self.noticed)

    def _watch(self) -> None:
        if not self.noticed and self._notice_came():
            self.noticed = True
            _say("the node is being preempted: SIGTERM to the command, which may save now")
            self.child.send_signal(signal.SIGTERM)
        if time.monotonic() >= self.next_sync:
            self.next_sync = time.monotonic() + self.sync_s
            self._sync(final=False)

    def _notice_came(self) -> bool:
        try:
            raw = read_checkpoint_request(self.environment.checkpoint_uri)
        except OSError as error:
            _say(f"could not read the checkpoint request: {error}")
            return False
        return checkpoint_request_applies(raw, self.environment.attempt)

    def _sync(self, *, final: bool) -> None:
        self._keep_output()
        try:
            copied = self.folder.sync(final=final)
        except OSError as error:
            _say(f"{ENV_CHECKPOINT_DIR} not kept this time: {error}")
            return
        if copied:
            _say(f"kept {len(copied)} file(s) of {ENV_CHECKPOINT_DIR}: {', '.join(copied[:5])}")

    def _keep_output(self) -> None:
        if self.output is None:
            return
        version, tail = self.output.snapshot()
        if version == self.kept_version:
            return
        try:
            write_attempt_log(
                self.environment.checkpoint_uri,
                self.environment.attempt,
                tail,
                storage=self.storage,
            )
        except OSError as error:
            _say(f"the output was not kept this time: {error}")
            return
        self.kept_version = version


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        _say("usage: python -m shared.usercode.launch -- COMMAND [ARGS...]")
        return EXIT_USAGE
    env = dict(os.environ if environ is None else environ)
    try:
        environment = TrainingEnvironment.from_mapping(env)
        storage, root = storage_for(environment.checkpoint_uri)
        sync_s = float(env.get(ENV_SYNC_S, "2"))
    except (TrainingEnvironmentError, ValueError) as error:
        _say(str(error))
        return EXIT_USAGE
    local = env.get(ENV_CHECKPOINT_DIR, "").strip()
    path = (
        Path(local)
        if local
        else default_folder(tempfile.gettempdir(), environment.job_id, environment.attempt)
    )
    folder = CheckpointFolder(storage, root, path)
    try:
        restored = folder.restore()
    except OSError as error:
        _say(f"could not restore {ENV_CHECKPOINT_DIR} from the store: {error}")
        restored = []
    if restored:
        _say(f"restored {len(restored)} file(s) into {ENV_CHECKPOINT_DIR}={path}")
    # Ray's stop signals every process of the job's tree: the command hears it itself, and
    # the launcher waits for it to end, then keeps its last files.
    signal.signal(signal.SIGTERM, _ignore)
    signal.signal(signal.SIGINT, _ignore)
    try:
        child = subprocess.Popen(
            args,  # the user's own command, as an argv
            env=child_environment(env, path),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    except OSError as error:
        _say(f"could not start {args[0]!r}: {error.strerror or error}")
        return 127
    assert child.stdout is not None
    output = KeptOutput(child.stdout, sys.stdout.buffer)
    supervision = Supervision(
        environment, folder, child, poll_s=1.0, sync_s=sync_s, output=output, storage=storage
    )
    return supervision.run()


def _ignore(signum: int, frame: FrameType | None) -> None:
    """The command got the same signal; the launcher outlives it to keep its files."""


if __name__ == "__main__":
    sys.exit(main())
