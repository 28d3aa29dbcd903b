"""A real notebook on a real kernel against the local stack: `examples/notebook.ipynb` submits a
job with `%spotrain submit` and one with a `%%spotrain` cell, and watches both to success."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

EXAMPLES = Path(__file__).parents[2] / "examples"
KERNEL = "spotrain-test"

# Cells the test adds after the example's: the async watcher, then what a user gets wrong,
# each answered in one line.
AWAITED = """\
from shared.notebook import watch_async

again = await watch_async(digits)
print("again:", again.state.value)"""
BAD_CELLS = {
    "%spotrain submit train_digits.py --gpus lots": "Invalid value for '--gpus'",
    "%spotrain submit no_such_script.py --gpus 1": "no_such_script.py not found in",
    "%spotrain submit train_digits.py --gpus 12": (
        "rejected: the job asks for 12 GPUs; the limit per job is 8"
    ),
    "%%spotrain --gpus 1 stray\nprint('never runs')": "the cell is the script",
    "%spotrain launch train_digits.py": "unknown command 'launch'",
    "%spotrain watch no-such-job": "no job no-such-job",
    "%spotrain cancel no-such-job": "no job no-such-job",
}


def kernel_manager(kernels: Path) -> AsyncKernelManager:
    """A kernel of this interpreter (the project's venv), whatever kernels the machine has."""
    spec = kernels / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "spotrain test",
                "language": "python",
            }
        )
    )
    return AsyncKernelManager(
        kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)])
    )


def new_cell(source: str, tags: list[str] | None = None) -> Any:
    metadata = {"tags": tags} if tags else {}
    return nbformat.v4.new_code_cell(source, metadata=metadata)  # type: ignore[no-untyped-call]  # nbformat's builders are untyped


def text_of(outputs: list[Any], output_type: str) -> str:
    """The text/plain of the outputs of one type, a line each; streams joined as written."""
    if output_type == "stream":
        # The kernel may cut what was printed into several stream messages anywhere.
        return "".join(o["text"] for o in outputs if o["output_type"] == "stream")
    return "\n".join(o["data"]["text/plain"] for o in outputs if o["output_type"] == output_type)


async def test_a_notebook_submits_with_both_magics_and_watches_the_jobs_to_success(
    local_stack: dict[str, str], tmp_path: Path
) -> None:
    workdir = tmp_path / "work"
    shutil.copytree(EXAMPLES, workdir, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_*"))
    notebook = nbformat.read(workdir / "notebook.ipynb", as_version=4)  # type: ignore[no-untyped-call]  # nbformat's readers are untyped
    example_cells = len(notebook.cells)
    notebook.cells.append(new_cell(AWAITED))
    for source in BAD_CELLS:
        notebook.cells.append(new_cell(source, tags=["raises-exception"]))

    client = NotebookClient(
        notebook,
        km=kernel_manager(tmp_path / "kernels"),
        timeout=120,
        resources={"metadata": {"path": str(workdir)}},
    )
    await client.async_execute(env=local_stack, cleanup_kc=True)

    code = [cell for cell in notebook.cells[:example_cells] if cell.cell_type == "code"]
    load, line_magic, cell_magic, watch_function, watch_magic = code
    assert not [o for o in load.outputs if o["output_type"] == "error"], load.outputs

    # %spotrain submit: a handle at once.
    submitted = text_of(line_magic.outputs, "execute_result")
    assert submitted.startswith("train-digits-"), line_magic.outputs
    assert ": accepted · follow it: %spotrain watch train-digits-" in submitted
    digits_id = submitted.split(":")[0]

    # %%spotrain --wait: the cell ran as a job, its progress shown live to the end.
    line = text_of(cell_magic.outputs, "display_data")
    assert line.startswith("cell-"), cell_magic.outputs
    cell_id = line.split(" ")[0]
    assert f"{cell_id} · succeeded · attempt 1 · step " in line
    assert "/10" in line, "the cell's progress reached the notebook"
    assert "loss=" in line
    assert text_of(cell_magic.outputs, "execute_result") == f"{cell_id}: succeeded"
    html = [o["data"]["text/html"] for o in cell_magic.outputs if "text/html" in o.get("data", {})]
    assert html, "the notebook gets an HTML line too"
    assert "<progress" in html[0]

    # watch(job): the line ends with the job, and the final record comes back.
    line = text_of(watch_function.outputs, "display_data")
    assert line.startswith(f"{digits_id} · succeeded · attempt 1 · step "), line
    assert "/60" in line, "the script's progress reached the notebook"
    assert "succeeded after 1 attempt(s)" in text_of(watch_function.outputs, "stream")

    # %spotrain watch: the last job submitted here, the cell's, over already.
    line = text_of(watch_magic.outputs, "display_data")
    assert line.startswith(f"{cell_id} · succeeded · attempt 1"), watch_magic.outputs

    # await watch_async(job): the same, without blocking the kernel's loop.
    awaited = notebook.cells[example_cells]
    assert text_of(awaited.outputs, "display_data").startswith(f"{digits_id} · succeeded")
    assert "again: succeeded" in text_of(awaited.outputs, "stream")

    for cell, expected in zip(notebook.cells[example_cells + 1 :], BAD_CELLS.values(), strict=True):
        message = text_of(cell.outputs, "stream").strip()
        assert [o["output_type"] for o in cell.outputs] == ["stream"] * len(cell.outputs)
        assert message.startswith("UsageError: "), cell.outputs
        assert expected in message
        assert len(message.splitlines()) == 1, message
        assert "Traceback" not in message
