"""Least privilege on the bus: one NATS user per service and client role, each allowed the
subjects its work takes and nothing else (`spotrain nats-config`, `spotrain up --secure`)."""

from shared.messaging.settings import Role
from shared.natsauth.files import NatsConfig, read_passwords, role_env, write_nats_config
from shared.natsauth.permissions import (
    TABLE,
    BusNames,
    RoleSpec,
    UserPermissions,
    inbox_prefix,
    permissions,
    replay_subjects,
)
from shared.natsauth.server_config import TlsFiles, render_credentials, render_server_config

__all__ = [
    "TABLE",
    "BusNames",
    "NatsConfig",
    "Role",
    "RoleSpec",
    "TlsFiles",
    "UserPermissions",
    "inbox_prefix",
    "permissions",
    "read_passwords",
    "render_credentials",
    "render_server_config",
    "replay_subjects",
    "role_env",
    "write_nats_config",
]
