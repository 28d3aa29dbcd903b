"""The Redis that keeps a local Ray head's state (`spotrain up --ray-ft`): Ray's GCS fault
tolerance. While it runs, a head killed and started again finds its cluster as it was:
the nodes carry on, and so do the jobs whose drivers were not on the head.

The stack runs its own (Debian's redis-server, `tools/install-redis`) with a password of
its own, in memory only: `down` ends the cluster, and its state with it. Or it is given
one (`SPOTRAIN_LOCAL_RAY_REDIS_ADDRESS` and `_PASSWORD`), which `up` checks before it
starts a head that would otherwise come up without fault tolerance.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from shared.localstack.processes import find_tool
from shared.localstack.settings import LocalStackSettings

COMPONENT = "redis"
NAMESPACE_FILE = "ray-namespace"
"""In the stack's run folder: the key prefix of this cluster's state in Redis. A new one
for each cluster (`up` after `down`), so a head never takes an old cluster's state for its
own; the same one for a head started again."""


def find_binary(settings: LocalStackSettings) -> str | None:
    """`SPOTRAIN_LOCAL_REDIS_BINARY`, else the checkout's `.tools/bin/redis-server`, else one
    on PATH; None if there is none."""
    return find_tool(settings.redis_binary, "redis-server")


def address(settings: LocalStackSettings) -> str:
    return settings.ray_redis_address or f"{settings.host}:{settings.redis_port}"


def password(settings: LocalStackSettings) -> str:
    """The given Redis's password, or the stack's own Redis's (made once, mode 0600)."""
    if settings.ray_redis_address is not None:
        given = settings.ray_redis_password
        return given.get_secret_value() if given is not None else ""
    path = settings.redis_dir / "password"
    if not path.exists():
        settings.redis_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(24))
    return path.read_text().strip()


def write_config(settings: LocalStackSettings) -> Path:
    """The stack's own Redis: loopback only, the password from a file rather than its
    command line, nothing written to disk."""
    config = settings.redis_dir / "redis.conf"
    lines = [
        f"bind {settings.host}",
        f"port {settings.redis_port}",
        f"requirepass {password(settings)}",
        'save ""',
        "appendonly no",
        f"dir {settings.redis_dir}",
        "protected-mode yes",
    ]
    config.touch(mode=0o600)
    config.write_text("\n".join(lines) + "\n")
    return config


def namespace(settings: LocalStackSettings) -> str:
    path = settings.run_dir / NAMESPACE_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"spotrain-{secrets.token_hex(4)}")
    return path.read_text().strip()
