"""The local stack's NATS cluster (`spotrain up --nats-cluster N`): each server's ports,
name, store and routes, and the store saying how many servers made it."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.localstack.settings import LocalStackSettings
from shared.localstack.stack import components


def cluster(home: Path, servers: int = 3) -> LocalStackSettings:
    return LocalStackSettings(
        home=home, nats_port=4300, nats_monitor_port=8300, nats_cluster_port_base=6300,
        nats_servers=servers,
    )  # fmt: skip


def test_each_server_has_ports_a_name_and_a_store_of_its_own(tmp_path: Path) -> None:
    servers = cluster(tmp_path).nats
    assert [s.name for s in servers] == [f"spotrain-local-{n}" for n in (1, 2, 3)]
    assert [s.component for s in servers] == ["nats", "nats-2", "nats-3"]
    assert servers[0].client_port == 4300
    assert servers[0].monitor_port == 8300
    ports = [p for s in servers for p in (s.client_port, s.monitor_port, s.route_port)]
    assert len(set(ports)) == len(ports) == 9
    assert len({s.store_dir for s in servers}) == 3
    settings = cluster(tmp_path)
    assert settings.nats_url.split(",") == [f"nats://127.0.0.1:{s.client_port}" for s in servers]
    assert settings.replicas == 3
    assert settings.environment()["SPOTRAIN_LOCAL_NATS_SERVERS"] == "3"


@pytest.mark.parametrize(("servers", "replicas"), [(1, 1), (2, 2), (3, 3), (5, 3)])
def test_copies_are_one_per_server_three_at_most(
    tmp_path: Path, servers: int, replicas: int
) -> None:
    assert cluster(tmp_path, servers).replicas == replicas


def test_a_single_server_is_in_no_cluster(tmp_path: Path) -> None:
    [server] = cluster(tmp_path, 1).nats
    assert server.route_port is None
    assert server.name == "spotrain-local"
    assert server.store_dir == tmp_path / "nats"


def test_each_member_routes_to_the_others_under_its_own_name(tmp_path: Path) -> None:
    settings = cluster(tmp_path)
    nats = [c for c in components(settings) if c.name.startswith("nats")]
    assert [c.name for c in nats] == ["nats", "nats-2", "nats-3"]
    for component, server in zip(nats, settings.nats, strict=True):
        config = Path(component.argv[component.argv.index("--config") + 1]).read_text()
        assert f'server_name: "{server.name}"' in config
        assert f'listen: "127.0.0.1:{server.route_port}"' in config
        others = {s.route_port for s in settings.nats} - {server.route_port}
        for port in others:
            assert f"nats-route://127.0.0.1:{port}" in config
        assert f"nats-route://127.0.0.1:{server.route_port}" not in config


def test_the_store_says_how_many_servers_made_it(tmp_path: Path) -> None:
    assert LocalStackSettings(home=tmp_path).store_made_by is None
    (tmp_path / "nats" / "jetstream").mkdir(parents=True)
    assert LocalStackSettings(home=tmp_path).store_made_by == 1, "made before it said"
    (tmp_path / "nats" / "servers").write_text("3")
    unset = LocalStackSettings(home=tmp_path)
    assert unset.store_made_by == 3
    assert unset.nats_server_count == 3, "unset: as the store says"
    assert len(unset.nats) == 3


def test_a_secure_clusters_routes_take_a_password_of_their_own(tmp_path: Path) -> None:
    """On a secure stack each member includes the stack's users and asks its routes for a
    password (mode 0600): another user's process on the host cannot join as a server."""
    settings = cluster(tmp_path).model_copy(update={"secure": True})
    nats = [c for c in components(settings) if c.name.startswith("nats")]
    configs = [Path(c.argv[c.argv.index("--config") + 1]) for c in nats]
    password = (settings.nats_auth_dir / "routes.password").read_text().strip()
    assert len(password) >= 32
    for config in configs:
        text = config.read_text()
        assert text.startswith('include "nats-server.conf"')
        assert f'authorization {{ user: "route", password: "{password}" }}' in text
        assert f"nats-route://route:{password}@127.0.0.1:" in text
        assert config.stat().st_mode & 0o077 == 0
        assert config.parent == settings.nats_auth_dir
