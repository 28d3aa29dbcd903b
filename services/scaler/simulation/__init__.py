"""Offline tools: the trace replay, the single-job deadline head-to-head, and what-if on
recorded demand. They call the live scaler's pure policies as they are; the live service
(handlers, bootstrap, adapters) never imports them (an import-linter contract)."""
