"""A throwaway nats-server with JetStream, for tests and benchmarks: free port, own store."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from shared.localstack.ports import free_port
from shared.localstack.stack import nats_server_binary


class NatsServer:
    """One nats-server with JetStream; `restart` keeps its port and its store."""

    def __init__(self, store_dir: Path, config_file: Path | None = None) -> None:
        self.port = free_port()
        self.store_dir = store_dir
        self.config_file = config_file
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [
            nats_server_binary(),
            "--jetstream",
            "--store_dir", str(self.store_dir),
            "--addr", "127.0.0.1",
            "--port", str(self.port),
        ]  # fmt: skip
        if self.config_file is not None:
            argv += ["--config", str(self.config_file)]
        self._process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.01)
        msg = f"nats-server did not listen on {self.port}"
        raise RuntimeError(msg)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def kill(self) -> None:
        """An unclean death: SIGKILL, as when a node vanishes."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def restart(self) -> None:
        self.stop()
        self.start()
