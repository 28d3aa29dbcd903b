"""`%spotrain` and `%%spotrain`: the CLI's options, a cell as a script, one-line errors."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

import pytest
import typer
from IPython.core.error import UsageError
from IPython.core.extensions import ExtensionManager
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from shared.cli.console import CliError
from shared.events.types import CapacityClass
from shared.notebook.magics import SpotrainMagics
from shared.notebook.submission import (
    CELL_SCRIPT,
    cell_script_name,
    cell_workspace,
    parse_submit,
)
from shared.workspace import WorkspaceError, pack


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The notebook's folder: a script and a data file, and the kernel's working directory."""
    (tmp_path / "train.py").write_text("print('train')\n")
    (tmp_path / "data.csv").write_text("x,y\n1,2\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[InteractiveShell]:
    """A real IPython shell with the extension loaded, keeping nothing in the home folder."""
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    # A shell started from another activated virtualenv: IPython warns of it, and the
    # suite turns warnings into errors.
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    config = Config()
    config.HistoryManager.enabled = False
    ipython = InteractiveShell.instance(config=config)
    extensions(ipython).load_extension("shared.notebook")
    yield ipython
    extensions(ipython).unload_extension("shared.notebook")
    InteractiveShell.clear_instance()


def extensions(ipython: InteractiveShell) -> ExtensionManager:
    manager = ipython.extension_manager
    assert isinstance(manager, ExtensionManager)
    return manager


def test_the_line_takes_the_clis_options_and_builds_the_same_request(workdir: Path) -> None:
    """Every option of `spotrain submit` means the same in the notebook."""
    options = parse_submit(
        [
            "train.py", "--gpus", "2", "--workers", "3", "--on-demand", "--priority", "7",
            "--checkpoint-every", "10m", "--label", "team=vision", "--env", "SEED=1",
            "--pip", "tqdm", "--job-id", "my-run", "--experiment", "sweep",
            "--", "--lr", "0.1",
        ]
    )  # fmt: skip
    assert options is not None
    fields = options.fields
    assert fields["entrypoint"] == ("python", "train.py", "--lr", "0.1")
    assert fields["worker"]["gpus"] == 2
    assert (fields["num_workers"], fields["capacity"]) == (3, CapacityClass.ON_DEMAND)
    assert (fields["priority"], fields["checkpoint_interval_s"]) == (7, 600)
    assert (fields["labels"], fields["env"], fields["pip"]) == (
        {"team": "vision"},
        {"SEED": "1"},
        ("tqdm",),
    )
    assert (fields["job_id"], fields["experiment"]) == ("my-run", "sweep")
    assert options.workdir == Path()
    assert not options.wait


def test_a_secret_is_named_never_carried(workdir: Path) -> None:
    options = parse_submit(["train.py", "--secret", "HF_TOKEN=hf-token"])
    assert options is not None
    assert options.fields["secrets"] == {"HF_TOKEN": "hf-token"}
    assert "HF_TOKEN" not in options.fields["env"]


def test_the_job_id_defaults_to_the_scripts_name(workdir: Path) -> None:
    options = parse_submit(["train.py", "--wait"])
    assert options is not None
    assert options.fields["job_id"].startswith("train-")
    assert options.fields["capacity"] is CapacityClass.ANY
    assert options.wait


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["train.py", "--gpus", "lots"], "Invalid value for '--gpus'", id="bad-int"),
        pytest.param(["train.py", "--gpu", "1"], "No such option: --gpu", id="unknown-option"),
        pytest.param([], "Missing argument 'script'", id="no-script"),
        pytest.param(["missing.py"], "missing.py not found in", id="missing-script"),
        pytest.param(
            ["train.py", "--spot", "--any"], "choose one of --spot, --on-demand, --any", id="two"
        ),
        pytest.param(["train.py", "--label", "oops"], "--label takes KEY=VALUE", id="bad-label"),
        pytest.param(
            ["train.py", "--secret", "HF_TOKEN"], "--secret takes KEY=VALUE", id="bad-secret"
        ),
        pytest.param(
            ["train.py", "--secret", "T=a", "--env", "T=b"],
            "T is set both as an environment variable and as a secret",
            id="secret-and-env",
        ),
        pytest.param(
            ["train.py", "--checkpoint-every", "soon"], "not a duration: 'soon'", id="bad-duration"
        ),
        pytest.param(
            ["train.py", "--gpus", "17"],
            "invalid job: gpus: Input should be less",
            id="invalid-job",
        ),
        pytest.param(
            ["train.py", "--workdir", "nowhere"], "working directory nowhere does not", id="workdir"
        ),
        pytest.param(
            ["train.py", "--workers", "2..4"],
            "--workers 2..4 needs a Ray Train script",
            id="range-on-a-script-ray-train-does-not-run",
        ),
    ],
)
def test_bad_options_are_refused_before_anything_is_uploaded(
    workdir: Path, argv: list[str], message: str
) -> None:
    """The CLI's own checks, with its messages."""
    with pytest.raises((CliError, typer.TyperException)) as raised:
        parse_submit(argv)
    error = raised.value
    text = error.format_message() if isinstance(error, typer.TyperException) else str(error)
    assert message in text


def test_help_prints_the_clis_options_and_submits_nothing(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse_submit(["--help"]) is None
    assert "--gpus" in capsys.readouterr().out


def test_a_cell_is_the_script_and_its_arguments_follow_the_dashes(workdir: Path) -> None:
    options = parse_submit(["--gpus", "1", "--", "--epochs", "2"], cell="print('hi')")
    assert options is not None
    assert options.script == CELL_SCRIPT
    assert options.fields["entrypoint"] == ("python", CELL_SCRIPT, "--epochs", "2")
    assert options.fields["job_id"].startswith("cell-")


def test_a_cell_refuses_words_that_are_not_options(workdir: Path) -> None:
    """`%%spotrain train.py` is a mistake: the cell is the script."""
    with pytest.raises(CliError, match="the cell is the script"):
        parse_submit(["train.py", "--gpus", "1"], cell="print('hi')")


def test_a_cell_does_not_shadow_a_cell_py_of_the_working_directory(workdir: Path) -> None:
    (workdir / CELL_SCRIPT).write_text("print('mine')\n")
    name = cell_script_name(workdir, "print('hi')")
    assert name.startswith("cell_")
    assert name.endswith(".py")
    assert name == cell_script_name(workdir, "print('hi')"), "the same cell, the same name"


def test_the_cells_workspace_is_what_submit_would_ship_plus_the_cell(
    workdir: Path, tmp_path: Path
) -> None:
    (workdir / ".spotrainignore").write_text("*.csv\n")
    into = tmp_path / "scratch"
    into.mkdir()
    root = cell_workspace(workdir, "print('hi')", CELL_SCRIPT, into)
    with zipfile.ZipFile(BytesIO(pack(root).data)) as shipped:
        names = set(shipped.namelist())
        assert shipped.read(CELL_SCRIPT) == b"print('hi')\n"
    assert names == {".spotrainignore", "train.py", CELL_SCRIPT}
    assert not (workdir / CELL_SCRIPT).exists(), "the notebook's folder is left as it was"


def test_a_cell_file_the_ignore_rules_would_drop_is_refused(workdir: Path, tmp_path: Path) -> None:
    (workdir / ".gitignore").write_text("cell*.py\n")
    into = tmp_path / "scratch"
    into.mkdir()
    with pytest.raises(WorkspaceError, match="ignored"):
        cell_workspace(workdir, "print('hi')", CELL_SCRIPT, into)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        pytest.param("submit train.py --gpus lots", "Invalid value for '--gpus'", id="bad-int"),
        pytest.param("submit missing.py", "missing.py not found in", id="missing-script"),
        pytest.param("launch train.py", "unknown command 'launch'", id="unknown-command"),
        pytest.param("watch", "no job submitted from this notebook yet", id="watch-nothing"),
        pytest.param("cancel", "usage: %spotrain cancel JOB", id="cancel-without-job"),
        pytest.param("submit 'train.py", "cannot read the line", id="unbalanced-quote"),
    ],
)
def test_a_mistake_is_one_usage_error_line(
    shell: InteractiveShell, workdir: Path, line: str, message: str
) -> None:
    """IPython shows a UsageError as its message alone, never a traceback."""
    with pytest.raises(UsageError) as raised:
        shell.run_line_magic("spotrain", line)
    assert type(raised.value) is UsageError, "IPython shortens only UsageError itself"
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_mistake_in_a_cell_line_is_one_usage_error_line(
    shell: InteractiveShell, workdir: Path
) -> None:
    magics = shell.magics_manager.registry["SpotrainMagics"]
    assert isinstance(magics, SpotrainMagics)
    with pytest.raises(UsageError, match="the cell is the script"):
        magics.run("stray --gpus 1", "print('hi')")


def test_the_magic_without_arguments_says_how_to_use_it(
    shell: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    shell.run_line_magic("spotrain", "")
    assert "%%spotrain [options] [-- ARGS]" in capsys.readouterr().out


def test_the_extension_registers_and_removes_both_magics(shell: InteractiveShell) -> None:
    magics = shell.magics_manager.magics
    assert "spotrain" in magics["line"]
    assert "spotrain" in magics["cell"]
    extensions(shell).unload_extension("shared.notebook")
    assert "spotrain" not in magics["line"]
    assert "spotrain" not in magics["cell"]
    extensions(shell).load_extension("shared.notebook")
    assert isinstance(shell.magics_manager.registry["SpotrainMagics"], SpotrainMagics)


RAY_TRAIN_CELL = "import ray.train\nfrom ray.train.torch import TorchTrainer\n"


@pytest.mark.parametrize(
    ("cell", "accepted"),
    [
        pytest.param(RAY_TRAIN_CELL, True, id="a-ray-train-cell"),
        pytest.param("print('hi')\n", False, id="a-plain-cell"),
    ],
)
def test_a_cell_with_an_elastic_range_must_be_ray_train(
    workdir: Path, cell: str, accepted: bool
) -> None:
    if accepted:
        options = parse_submit(["--workers", "2..4"], cell=cell)
        assert options is not None
        assert (options.fields["num_workers"], options.fields["max_workers"]) == (2, 4)
        return
    with pytest.raises(CliError, match="needs a Ray Train script"):
        parse_submit(["--workers", "2..4"], cell=cell)


def test_a_cell_sweeps_its_own_arguments_as_the_cli_does(workdir: Path) -> None:
    """`%%spotrain --sweep lr=...`: the cell's argparse names the keys; one job a point."""
    cell = "import argparse\np = argparse.ArgumentParser()\np.add_argument('--lr')\n"
    options = parse_submit(
        ["--gpus", "1", "--experiment", "nb-grid", "--sweep", "lr=0.1,0.2,0.3"], cell=cell
    )
    assert options is not None
    assert [r.entrypoint for r in options.sweep] == [
        ("python", CELL_SCRIPT, "--lr", "0.1"),
        ("python", CELL_SCRIPT, "--lr", "0.2"),
        ("python", CELL_SCRIPT, "--lr", "0.3"),
    ]
    assert {r.experiment for r in options.sweep} == {"nb-grid"}
    assert len({r.job_id for r in options.sweep}) == 3


def test_a_sweep_key_the_script_does_not_take_is_one_line(workdir: Path) -> None:
    with pytest.raises(CliError, match="--sweep dropout is neither a submit option"):
        parse_submit(["train.py", "--sweep", "dropout=0.1,0.2"])
