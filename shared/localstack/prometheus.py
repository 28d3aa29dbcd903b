"""The local stack's optional Prometheus (`spotrain up --prometheus`): what it scrapes, how
it is started and where its binary is. The stack itself (stack.py) runs it like any part."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shared.localstack.processes import REPO_TOOLS, find_tool
from shared.localstack.settings import LocalStackSettings

RAY_DISCOVERY_FILE = "prom_metrics_service_discovery.json"
"""Ray's head lists every live node's metrics port, the autoscaler's and the dashboard's in
this file (Prometheus file-SD format), rewritten every 5 s as nodes come and go."""


def ray_discovery_file(settings: LocalStackSettings) -> Path:
    """A link in the head's temp dir to the file in its current session, renewed when the
    head restarts; Ray keeps both names for Prometheus configurations like this one."""
    return settings.ray_temp_dir / RAY_DISCOVERY_FILE


def config_file(settings: LocalStackSettings) -> Path:
    return settings.run_dir / "prometheus.yml"


def prometheus_config(settings: LocalStackSettings, services: Sequence[str]) -> dict[str, Any]:
    """The scrape configuration: each replica of each service (the first on base+1,
    base+2, ... in `services` order, each next one 10 further), labelled
    `service=<name>` and `replica=<its name>`, and every Ray node the head lists. Pure: no
    I/O but the count of replicas the stack runs."""
    s = settings
    return {
        # Locally a demo lasts a minute: scrape often enough to see it.
        "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "2s"},
        "scrape_configs": [
            {
                "job_name": "spotrain",
                "static_configs": [
                    {
                        "targets": [f"{s.host}:{s.service_port(offset, replica)}"],
                        "labels": {
                            "service": service,
                            "replica": service if replica == 1 else f"{service}-{replica}",
                        },
                    }
                    for replica in range(1, s.replica_count + 1)
                    for offset, service in enumerate(services, start=1)
                ],
            },
            {
                "job_name": "ray",
                "file_sd_configs": [
                    # Ray replaces the file behind a link; a change there reaches no file
                    # watch on the link's folder, so Prometheus also re-reads it this often.
                    {"files": [str(ray_discovery_file(s))], "refresh_interval": "5s"}
                ],
            },
        ],
    }


def write_config(settings: LocalStackSettings, services: Sequence[str]) -> Path:
    """Write the configuration where `argv` points; JSON, which is also YAML."""
    path = config_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(prometheus_config(settings, services), indent=2) + "\n")
    return path


def argv(binary: str, settings: LocalStackSettings) -> list[str]:
    s = settings
    return [
        binary,
        f"--config.file={config_file(s)}",
        f"--storage.tsdb.path={s.home / 'prometheus'}",
        f"--web.listen-address={s.host}:{s.prometheus_port}",
        "--storage.tsdb.retention.time=7d",
    ]


def find_binary(settings: LocalStackSettings) -> str | None:
    """`SPOTRAIN_LOCAL_PROMETHEUS_BINARY`, else the checkout's `.tools/bin/prometheus`,
    else one on PATH; None if there is none."""
    return find_tool(settings.prometheus_binary, "prometheus", REPO_TOOLS)
