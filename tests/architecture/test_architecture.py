"""The architecture is checked, not hoped for: import contracts and pure policies."""

from __future__ import annotations

import ast
import re
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


NOT_WHOLLY_PURE = {
    "services/preemption_watcher/adapters/k8s_nodes.py": "an adapter naming its pure reader",
    "services/scaler/simulation/__init__.py": "says the simulator calls the pure policies",
    "shared/desk.py": "messages and their pure parts; the desk's I/O is in the same module",
    "shared/usercode/ray_train_runs.py": "pure but for reading the latest snapshot",
}
"""Modules whose docstring names purity without claiming it for the whole module."""

_CLAIMS_PURITY = re.compile(r"\bpure\b", re.IGNORECASE)


def pure_modules() -> list[Path]:
    """Every service's policy and model modules, the event contract's data modules, the
    domain's rules (`shared/policy`), and every other module whose docstring says it is
    pure."""
    services = [p for p in ROOT.glob("services/*/*.py") if p.stem in ("policy", "decide", "model")]
    services += list(ROOT.glob("services/*/policy/*.py"))  # a policy with several modules
    contract = [ROOT / "shared/events" / name for name in ("data.py", "types.py", "catalog.py")]
    rules = list(ROOT.glob("shared/policy/**/*.py"))
    claimed = [
        path
        for path in [*ROOT.glob("services/**/*.py"), *ROOT.glob("shared/**/*.py")]
        if str(path.relative_to(ROOT)) not in NOT_WHOLLY_PURE
        and _CLAIMS_PURITY.search(ast.get_docstring(ast.parse(path.read_text())) or "")
    ]
    return sorted({*services, *contract, *rules, *claimed})


def test_the_purity_check_reads_what_it_should() -> None:
    """The domain's rules and the modules that claim purity are all read (a glob that
    matched nothing would pass every module)."""
    read = {str(path.relative_to(ROOT)) for path in pure_modules()}
    assert {"shared/policy/deadline.py", "shared/policy/cost/ledger.py"} <= read
    assert {"shared/access.py", "shared/replay/plan.py", "shared/slack/policy.py"} <= read
    assert not read & NOT_WHOLLY_PURE.keys()
    assert len(read) >= 50


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
