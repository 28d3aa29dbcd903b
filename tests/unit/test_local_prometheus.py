"""The local stack's Prometheus: what it scrapes, how it is started, where its binary comes
from (tests/e2e/test_local_prometheus.py runs it for real)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from shared.localstack import prometheus, stack
from shared.localstack.settings import LocalStackSettings
from shared.localstack.stack import SERVICES, StackError, components, prometheus_binary


@pytest.fixture
def settings(tmp_path: Path) -> LocalStackSettings:
    binary = tmp_path / "bin" / "prometheus"
    binary.parent.mkdir()
    binary.touch()
    return LocalStackSettings(
        home=tmp_path / "stack",
        service_port_base=9460,
        prometheus=True,
        prometheus_port=9090,
        prometheus_binary=binary,
    )


@pytest.mark.parametrize(
    ("service", "target"),
    [
        ("submitter", "127.0.0.1:9461"),
        ("scaler", "127.0.0.1:9462"),
        ("preemption_watcher", "127.0.0.1:9463"),
        ("checkpointer", "127.0.0.1:9464"),
    ],
)
def test_each_service_is_a_target_labelled_with_its_name(
    settings: LocalStackSettings, service: str, target: str
) -> None:
    """The services' ports in SERVICES order, base+1 to base+4, each with its `service`."""
    (job,) = [
        j for j in prometheus.prometheus_config(settings, SERVICES)["scrape_configs"]
        if j["job_name"] == "spotrain"
    ]  # fmt: skip
    labels = {"service": service, "replica": service}
    assert {"targets": [target], "labels": labels} in job["static_configs"]
    assert len(job["static_configs"]) == 4


def test_every_replica_is_scraped_under_its_own_name(settings: LocalStackSettings) -> None:
    """Two replicas of each service (`up --replicas 2`): the second on base+11 to base+14."""
    two = settings.model_copy(update={"service_replicas": 2})
    (job,) = [
        j for j in prometheus.prometheus_config(two, SERVICES)["scrape_configs"]
        if j["job_name"] == "spotrain"
    ]  # fmt: skip
    assert len(job["static_configs"]) == 8
    second = {"service": "scaler", "replica": "scaler-2"}
    assert {"targets": ["127.0.0.1:9472"], "labels": second} in job["static_configs"]


def test_ray_nodes_come_from_the_file_the_head_writes_in_its_temp_dir(
    settings: LocalStackSettings,
) -> None:
    """Ray's head keeps the file-SD list of its nodes at <temp dir>/prom_metrics_...json."""
    (job,) = [
        j for j in prometheus.prometheus_config(settings, SERVICES)["scrape_configs"]
        if j["job_name"] == "ray"
    ]  # fmt: skip
    (sd,) = job["file_sd_configs"]
    assert sd["files"] == [str(settings.ray_temp_dir / "prom_metrics_service_discovery.json")]


def test_the_local_scrape_interval_is_short(settings: LocalStackSettings) -> None:
    """A local run lasts minutes: a 2 s interval shows it."""
    config = prometheus.prometheus_config(settings, SERVICES)
    assert config["global"]["scrape_interval"] == "2s"


def test_the_written_configuration_reads_back_as_yaml(settings: LocalStackSettings) -> None:
    """Written as JSON, which YAML readers (Prometheus among them) read the same."""
    path = prometheus.write_config(settings, SERVICES)
    assert path == settings.run_dir / "prometheus.yml"
    assert yaml.safe_load(path.read_text()) == prometheus.prometheus_config(settings, SERVICES)
    assert json.loads(path.read_text()) == prometheus.prometheus_config(settings, SERVICES)


def test_prometheus_starts_after_the_services_when_asked(settings: LocalStackSettings) -> None:
    """Last to start, so first to stop; it listens and is probed where the settings say."""
    parts = components(settings)
    assert [p.name for p in parts][-6:] == [*SERVICES, "ui", "prometheus"]
    part = parts[-1]
    assert part.argv == [
        str(settings.prometheus_binary),
        f"--config.file={settings.run_dir / 'prometheus.yml'}",
        f"--storage.tsdb.path={settings.home / 'prometheus'}",
        "--web.listen-address=127.0.0.1:9090",
        "--storage.tsdb.retention.time=7d",
    ]
    assert part.health_url == "http://127.0.0.1:9090/-/ready"
    assert part.endpoint == "http://127.0.0.1:9090"


def test_no_prometheus_unless_asked(settings: LocalStackSettings) -> None:
    """The default stack is the four services, NATS and Ray."""
    plain = settings.model_copy(update={"prometheus": False})
    assert "prometheus" not in [p.name for p in components(plain)]


def test_one_left_running_is_still_a_part_for_down_and_status(
    settings: LocalStackSettings,
) -> None:
    """A plain `spotrain down` stops the Prometheus an `up --prometheus` started."""
    plain = settings.model_copy(update={"prometheus": False})
    plain.run_dir.mkdir(parents=True)
    (plain.run_dir / "prometheus.json").write_text("{}")
    assert [p.name for p in components(plain)][-1] == "prometheus"


def test_the_configured_binary_comes_first(settings: LocalStackSettings) -> None:
    """SPOTRAIN_LOCAL_PROMETHEUS_BINARY wins over .tools/bin and PATH."""
    assert prometheus_binary(settings) == str(settings.prometheus_binary)


def test_the_checkouts_tools_folder_comes_before_path(
    settings: LocalStackSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make test` installs it into .tools/bin, which need not be on PATH."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "prometheus").touch()
    monkeypatch.setattr(prometheus, "REPO_TOOLS", tools)
    unset = settings.model_copy(update={"prometheus_binary": None})
    assert prometheus_binary(unset) == str(tools / "prometheus")


def test_a_missing_binary_says_how_to_install_it(
    settings: LocalStackSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No binary anywhere: the error names the installer."""
    monkeypatch.setattr(prometheus, "REPO_TOOLS", tmp_path / "nowhere")
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    unset = settings.model_copy(update={"prometheus_binary": None})
    with pytest.raises(StackError, match=r"run tools/install-prometheus \.tools/bin"):
        prometheus_binary(unset)
    with pytest.raises(StackError, match="install-prometheus"):
        stack.components(unset)
