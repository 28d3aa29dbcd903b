"""Where the local stack keeps its state and which ports it takes, from `SPOTRAIN_LOCAL_*`."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

Port = int


SINGLE_SERVER_NAME = "spotrain-local"
REPLICA_PORT_STEP = 10
"""How far a service's next replica's port is from the one before."""
REPLICAS_FILE = "replicas"
"""In the run folder: how many replicas of each service the running stack has."""
STORE_SERVERS_FILE = "servers"
"""In the first server's store folder: how many servers made the store."""
CLUSTER_NAME = "spotrain-local"


@dataclass(frozen=True)
class NatsServerPorts:
    """One NATS server of the stack: its name, ports and store."""

    component: str
    """Its name among the stack's processes: `nats`, then `nats-2`, `nats-3`."""
    name: str
    client_port: Port
    monitor_port: Port
    route_port: Port | None
    """None for a server of its own, in no cluster."""
    store_dir: Path


class LocalStackSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPOTRAIN_LOCAL_", extra="ignore", frozen=True)

    home: Path = Field(default_factory=lambda: Path.home() / ".spotrain")
    """State directory: PID files, logs, the NATS store."""
    host: str = "127.0.0.1"
    nats_port: Port = Field(4222, gt=0, lt=65536)
    nats_monitor_port: Port = Field(8222, gt=0, lt=65536)
    nats_servers: int | None = Field(None, ge=1, le=5)
    """NATS servers in one JetStream cluster (`spotrain up --nats-cluster 3`), routed on
    loopback: the stream and every bucket then keep `replicas` copies, one per server.
    Unset: as many as made the stack's store (`nats/servers`), else one."""
    nats_cluster_port_base: Port = Field(6222, gt=0, lt=65000)
    """Three ports per server of a cluster: its route, and past the first server, its client
    and monitor ports (the first keeps `nats_port` and `nats_monitor_port`)."""
    ray_gcs_port: Port = Field(6380, gt=0, lt=10002)
    """Kept below Ray's worker port range (10002-19999)."""
    ray_dashboard_port: Port = Field(8265, gt=0, lt=10002)
    ray_client_port: Port = Field(10001, gt=0, lt=10002)
    ray_head_port_base: Port = Field(52400, ge=20000, lt=65000)
    """The head's own node ports (agent, node manager, ...): a block of 64, so that two
    stacks on one machine do not both take Ray's default agent port."""
    service_port_base: Port = Field(9460, gt=0, lt=65000)
    """Services serve /metrics and /healthz on base+1 (submitter) to base+4; a second
    replica of each on base+11 to base+14, a third on base+21 to base+24."""
    service_replicas: int | None = Field(None, ge=1, le=3)
    """Replicas of each service (`spotrain up --replicas 2`): the work that must happen once
    is done by the one that holds the service's lease. Unset: as the running stack was
    started (`run/replicas`), else one."""
    start_timeout_s: float = Field(60, gt=0)
    secure: bool = False
    """One NATS user per component with only the subjects it needs (`spotrain up --secure`).
    A stack once started secure stays secure: its credentials folder says so."""
    prometheus: bool = False
    """Also run a Prometheus that scrapes the services and every Ray node
    (`spotrain up --prometheus`)."""
    prometheus_port: Port = Field(9090, gt=0, lt=65536)
    ui_port: Port = Field(7460, gt=0, lt=65536)
    """The web page (`spotrain ui`), on the stack's host only."""
    prometheus_binary: Path | None = None
    """Else `.tools/bin/prometheus` in the repository (tools/install-prometheus), else PATH."""
    ray_ft: bool = False
    """The head keeps its state in Redis (Ray's GCS fault tolerance, `spotrain up
    --ray-ft`): a head killed and started again finds its cluster as it was. A stack once
    started so stays so: its Redis folder says so."""
    redis_port: Port = Field(6390, gt=0, lt=65536)
    """The stack's own Redis, with `ray_ft`."""
    ray_redis_address: str | None = Field(None, pattern=r"^[^:\s]+:\d{1,5}$")
    """A Redis of your own for `ray_ft` (host:port), instead of the stack's."""
    ray_redis_password: SecretStr | None = None
    redis_binary: Path | None = None
    """Else `.tools/bin/redis-server` in the repository (tools/install-redis), else PATH."""

    def environment(self) -> dict[str, str]:
        """These settings as the variables that give them to another process (`spotrain`
        run as a subprocess, a service): its home, every port, and the bus URL."""
        ports = {
            name: value
            for name, value in self.model_dump().items()
            if name.endswith("_port") or name.endswith("_port_base")
        }
        return {
            "SPOTRAIN_LOCAL_HOME": str(self.home),
            # Only when given: unset, the other process reads the store as this one does.
            **(
                {"SPOTRAIN_LOCAL_NATS_SERVERS": str(self.nats_servers)}
                if self.nats_servers is not None
                else {}
            ),
            **(
                {"SPOTRAIN_LOCAL_SERVICE_REPLICAS": str(self.service_replicas)}
                if self.service_replicas is not None
                else {}
            ),
            **{f"SPOTRAIN_LOCAL_{name.upper()}": str(value) for name, value in ports.items()},
            "SPOTRAIN_NATS_URL": self.nats_url,
        }

    @property
    def nats_url(self) -> str:
        """Every server's address: a client follows the cluster through the loss of one."""
        return ",".join(f"nats://{self.host}:{server.client_port}" for server in self.nats)

    @property
    def nats(self) -> list[NatsServerPorts]:
        """The NATS servers of the stack, the first on `nats_port`."""
        if self.nats_server_count == 1:
            return [
                NatsServerPorts(
                    component="nats",
                    name=SINGLE_SERVER_NAME,
                    client_port=self.nats_port,
                    monitor_port=self.nats_monitor_port,
                    route_port=None,
                    store_dir=self.home / "nats",
                )
            ]
        servers = []
        for index in range(self.nats_server_count):
            base = self.nats_cluster_port_base + 3 * index
            servers.append(
                NatsServerPorts(
                    component="nats" if index == 0 else f"nats-{index + 1}",
                    name=f"{SINGLE_SERVER_NAME}-{index + 1}",
                    client_port=self.nats_port if index == 0 else base + 1,
                    monitor_port=self.nats_monitor_port if index == 0 else base + 2,
                    route_port=base,
                    store_dir=self.home / ("nats" if index == 0 else f"nats-{index + 1}"),
                )
            )
        return servers

    @property
    def replicas(self) -> int:
        """Copies of the stream and of each bucket: one per server, three at most."""
        return min(self.nats_server_count, 3)

    def service_port(self, offset: int, replica: int = 1) -> Port:
        """The /metrics and /healthz port of a service's replica (offset 1: the submitter)."""
        return self.service_port_base + offset + REPLICA_PORT_STEP * (replica - 1)

    @property
    def replica_count(self) -> int:
        if self.service_replicas is not None:
            return self.service_replicas
        started = self.run_dir / REPLICAS_FILE
        return int(started.read_text()) if started.is_file() else 1

    @property
    def nats_server_count(self) -> int:
        return self.nats_servers or self.store_made_by or 1

    @property
    def store_made_by(self) -> int | None:
        """How many servers made the stack's NATS store, as it says (None: no store yet)."""
        first = self.home / "nats"
        marker = first / STORE_SERVERS_FILE
        if marker.is_file():
            return int(marker.read_text())
        return 1 if (first / "jetstream").exists() else None  # made before the store said

    @property
    def dashboard_url(self) -> str:
        return f"http://{self.host}:{self.ray_dashboard_port}"

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def node_dir(self) -> Path:
        """Where the scaler's local provider records the Ray nodes it started."""
        return self.run_dir / "nodes"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @property
    def checkpoint_dir(self) -> Path:
        return self.home.resolve() / "checkpoints"

    @property
    def gcs_address(self) -> str:
        return f"{self.host}:{self.ray_gcs_port}"

    @property
    def nats_auth_dir(self) -> Path:
        """The server config and each role's credentials (`spotrain nats-config`)."""
        return self.home / "nats-auth"

    @property
    def ray_token_file(self) -> Path:
        """The secure stack's Ray token (`RAY_AUTH_MODE=token`): the submitter's key to Ray's
        job API, which Ray's own processes and job drivers also hold (mode 0600)."""
        return self.home / "ray-auth" / "token"

    @property
    def redis_dir(self) -> Path:
        return self.home / "redis"

    @property
    def is_ray_ft(self) -> bool:
        return self.ray_ft or (self.redis_dir / FT_MARKER).exists()

    @property
    def is_secure(self) -> bool:
        return self.secure or (self.nats_auth_dir / "nats-server.conf").exists()

    @property
    def prometheus_url(self) -> str:
        return f"http://{self.host}:{self.prometheus_port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.ui_port}"

    @property
    def ray_temp_dir(self) -> Path:
        """Short on purpose: Ray puts Unix sockets under it, and their paths are limited."""
        digest = hashlib.sha256(str(self.home.resolve()).encode()).hexdigest()[:10]
        return Path("/tmp") / f"spotrain-ray-{digest}"  # noqa: S108  # socket path length


FT_MARKER = "fault-tolerant"
"""In the Redis folder: the stack was started with `--ray-ft`."""


def isolated_stack(home: Path) -> LocalStackSettings:
    """A stack that can run beside others on one machine: its own state folder and free
    ports for everything (tests, benchmarks, a second stack on a laptop)."""
    from shared.localstack.ports import (  # noqa: PLC0415  # ports are probed only when asked
        free_port,
        free_port_below,
        free_port_block,
    )

    return LocalStackSettings(
        home=home,
        nats_port=free_port(),
        nats_monitor_port=free_port(),
        ray_gcs_port=free_port_below(10_000),
        ray_dashboard_port=free_port_below(10_000),
        ray_client_port=free_port_below(10_000),
        ray_head_port_base=free_port_block(64),
        # The services serve on base+1 to base+4 (the Slack bot, when run, on base+5).
        service_port_base=free_port_block(32),
        prometheus_port=free_port(),
        ui_port=free_port(),
        redis_port=free_port(),
        nats_cluster_port_base=free_port_block(15),
    )
