"""Finding free ports on this machine, for stacks, nodes and tests that must not collide."""

from __future__ import annotations

import socket

# Ports handed out by this process, so two calls never return the same one even before
# the first is bound.
_handed_out: set[int] = set()


def is_free(port: int, host: str = "127.0.0.1") -> bool:
    if port in _handed_out:
        return False
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port the kernel picks, outside Ray's worker range and ours."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def free_port_below(limit: int, start: int = 7000) -> int:
    """For Ray's own ports, which must stay below its worker port range (10002-19999)."""
    for port in range(start, limit):
        if is_free(port):
            _handed_out.add(port)
            return port
    msg = f"no free port between {start} and {limit}"
    raise RuntimeError(msg)


def free_port_block(size: int, start: int = 20_000, end: int = 32_000) -> int:
    """The first port of `size` consecutive free ports, e.g. for one Ray node."""
    for base in range(start, end - size, size):
        block = range(base, base + size)
        if all(is_free(port) for port in block):
            _handed_out.update(block)
            return base
    msg = f"no {size} consecutive free ports between {start} and {end}"
    raise RuntimeError(msg)
