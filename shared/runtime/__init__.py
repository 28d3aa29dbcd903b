"""Running a service: TaskGroup of consumers and tickers, signals, staged shutdown."""

from shared.runtime.service import RuntimeSettings, ServiceDefinition, Ticker, Watch, run, serve

__all__ = ["RuntimeSettings", "ServiceDefinition", "Ticker", "Watch", "run", "serve"]
