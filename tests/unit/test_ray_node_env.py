"""A Ray node's environment, which every job on it inherits: no platform credential."""

from __future__ import annotations

import sys
from pathlib import Path

from shared.localstack.ray_nodes import node_env

SCALERS = {
    "PATH": "/usr/bin",
    "HOME": "/home/me",
    "SPOTRAIN_NATS_USER": "scaler",
    "SPOTRAIN_NATS_PASSWORD": "hunter2",
    "SPOTRAIN_NATS_INBOX_PREFIX": "_INBOX_scaler",
    "SPOTRAIN_CREDENTIALS": "/home/me/alice.env",
    "SPOTRAIN_SLACK_BOT_TOKEN": "xoxb-1",
    "SPOTRAIN_SCALER_GKE_TOKEN": "t",
    "SPOTRAIN_LOCAL_HOME": "/home/me/.spotrain",
    "RAY_AUTH_MODE": "token",
    "RAY_AUTH_TOKEN_PATH": "/home/me/.spotrain/ray-auth/token",
}


def test_a_node_inherits_no_platform_credential() -> None:
    env = node_env(SCALERS)
    assert not {k for k in env if "NATS" in k or "CREDENTIALS" in k or "SLACK" in k}
    assert "SPOTRAIN_SCALER_GKE_TOKEN" not in env
    assert "hunter2" not in env.values()
    # What Ray and the job's interpreter need stays.
    assert env["RAY_AUTH_MODE"] == "token"
    assert env["SPOTRAIN_LOCAL_HOME"] == "/home/me/.spotrain"
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
