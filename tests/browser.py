"""A real headless Chromium for the web page's tests and benchmark: Debian's, which
tools/install-chromium links into .tools/bin, never a browser Playwright downloads (these
machines reach no CDN)."""

from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# As the machine's own check starts it: without the background-networking flags Chromium
# dials Google's hosts at start, which a closed network refuses, many at a time.
CHROMIUM_FLAGS = [
    "--no-sandbox",  # CI runs as root, where Chromium's sandbox will not start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str:
    """tools/install-chromium's link, else one on PATH."""
    linked = REPO / ".tools" / "bin" / "chromium"
    found = str(linked) if linked.exists() else shutil.which("chromium")
    if found is None:
        msg = "no chromium: run tools/install-chromium (make test does)"
        raise RuntimeError(msg)
    return found
