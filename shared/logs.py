"""structlog set-up: JSON lines in services, readable lines at a terminal."""

from __future__ import annotations

import logging
import sys

import structlog
import structlog.tracebacks


def configure_logging(*, json: bool, level: str = "info") -> None:
    """Configure structlog once per process; context bound with contextvars is merged in."""
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
