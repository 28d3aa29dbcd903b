"""The architecture is checked, not hoped for: import contracts and pure policies."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]


def test_import_contracts_hold() -> None:
    """Contracts live in pyproject.toml, each with the sentence that says why."""
    lint_imports = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    result = subprocess.run(
        [lint_imports, "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


FORBIDDEN_IN_POLICIES = {
    "asyncio",
    "nats",
    "ray",
    "google",
    "kubernetes",
    "structlog",
    "time",
    "uuid",
    "random",
}


def pure_modules() -> list[Path]:
    """Every service's policy and model modules, and the event contract's data modules."""
    services = [p for p in ROOT.glob("services/*/*.py") if p.stem in ("policy", "decide", "model")]
    services += list(ROOT.glob("services/*/policy/*.py"))  # a policy with several modules
    contract = [ROOT / "shared/events" / name for name in ("data.py", "types.py", "catalog.py")]
    return sorted(services) + contract


def test_policies_and_models_are_pure() -> None:
    """No async, no clock, no I/O libraries in any policy, model or event data module."""
    for path in pure_modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            assert not isinstance(node, ast.AsyncFunctionDef | ast.Await), f"{path}: async"
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                for name in names:
                    assert name.split(".")[0] not in FORBIDDEN_IN_POLICIES, (
                        f"{path}: imports {name}"
                    )
            if isinstance(node, ast.Attribute) and node.attr in ("now", "utcnow", "today"):
                raise AssertionError(f"{path}: reads the clock")
