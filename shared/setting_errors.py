"""A settings error as one line that names the variable to fix: pydantic-settings raises a
ValidationError of several lines that names the field, not the environment variable."""

from __future__ import annotations

from pydantic import ValidationError
from pydantic_settings import BaseSettings


def _settings_classes(root: type[BaseSettings] = BaseSettings) -> dict[str, type[BaseSettings]]:
    found: dict[str, type[BaseSettings]] = {}
    for child in root.__subclasses__():
        found[child.__name__] = child
        found.update(_settings_classes(child))
    return found


def is_settings_error(error: ValidationError) -> bool:
    return error.title in _settings_classes()


def setting_error_line(error: ValidationError) -> str:
    """`SPOTRAIN_LOCAL_NATS_PORT='99999': Input should be less than 65536` (the first
    problem; the count of the others after it)."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    settings = _settings_classes().get(error.title)
    prefix = str(settings.model_config.get("env_prefix", "")) if settings is not None else ""
    name = f"{prefix}{field}".upper() if settings is not None else field
    given = f"={first['input']!r}" if isinstance(first.get("input"), str | int | float) else ""
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{name}{given}: {first['msg']}{more}"
