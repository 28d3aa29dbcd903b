"""structlog set-up: JSON lines in services, readable lines at a terminal."""

from __future__ import annotations

import logging
import sys

import structlog


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
            structlog.processors.dict_tracebacks if json else structlog.dev.set_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        # Not cached: a logger used before configuration must not keep the defaults.
        cache_logger_on_first_use=False,
    )
