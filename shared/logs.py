"""structlog set-up: JSON lines in services, readable lines at a terminal."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger


def configure_logging(*, json: bool, level: str = "info") -> None:
    """Configure structlog once per process; context bound with contextvars is merged in."""
    import structlog  # noqa: PLC0415  # see deferred_logger
    import structlog.tracebacks  # noqa: PLC0415

    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            # Without locals: they are long, and they may hold secrets from job environments.
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            )
            if json
            else structlog.dev.set_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        # Not cached: a logger used before configuration must not keep the defaults.
        cache_logger_on_first_use=False,
    )


class _DeferredLogger:
    def __getattr__(self, name: str) -> Any:
        import structlog  # noqa: PLC0415  # at the first line logged

        return getattr(structlog.get_logger(), name)


def deferred_logger() -> FilteringBoundLogger:
    """structlog's logger for a module the CLI imports: structlog is imported at the first
    line logged, not with the module. The CLI logs only when something goes wrong, and
    importing structlog (its console renderer brings rich's tracebacks and pygments) is a
    tenth of `spotrain submit`."""
    return cast("FilteringBoundLogger", _DeferredLogger())
