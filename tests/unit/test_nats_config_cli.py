"""`spotrain nats-config`: writes the folder, and answers bad options with one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from shared.cli.console import CliError
from shared.cli.nats_config import register
from shared.natsauth import Role, read_passwords


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def root() -> None:
        """Commands are sub-commands, as in `spotrain`."""

    register(app)
    return app


def test_it_writes_the_configuration_and_a_file_per_role(tmp_path: Path) -> None:
    out = tmp_path / "nats"
    result = CliRunner().invoke(_app(), ["nats-config", "--out", str(out), "--prefix", "acme"])
    assert result.exit_code == 0, result.output
    assert (out / "nats-server.conf").is_file()
    assert set(read_passwords(out / "credentials.conf")) == set(Role)
    assert sorted(p.name for p in out.glob("*.env")) == sorted(f"{r.value}.env" for r in Role)
    assert '"acme.job.requested.>"' in (out / "nats-server.conf").read_text()
    assert "nats-server --jetstream --config" in result.output


def test_tls_options_reach_the_configuration(tmp_path: Path) -> None:
    out = tmp_path / "nats"
    args = ["--tls-cert", "/tls/cert.pem", "--tls-key", "/tls/key.pem", "--tls-ca", "/tls/ca.pem"]
    result = CliRunner().invoke(_app(), ["nats-config", "--out", str(out), *args, "--tls-verify"])
    assert result.exit_code == 0, result.output
    config = (out / "nats-server.conf").read_text()
    assert 'cert_file: "/tls/cert.pem"' in config
    assert "verify: true" in config


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--prefix", "Bad.Prefix"], "not a subject prefix", id="bad-prefix"),
        pytest.param(["--stream", "a.b"], "not a stream name", id="bad-stream"),
        pytest.param(["--tls-cert", "c.pem"], "go together", id="cert-without-key"),
        pytest.param(["--tls-ca", "ca.pem"], "need --tls-cert", id="ca-without-cert"),
        pytest.param(
            ["--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-verify"],
            "needs --tls-ca",
            id="verify-without-ca",
        ),
    ],
)
def test_bad_options_are_one_line_errors(tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(_app(), ["nats-config", "--out", str(tmp_path), *args])
    assert isinstance(result.exception, CliError)
    assert result.exception.exit_code == 2
    assert message in str(result.exception)
    assert "\n" not in str(result.exception)
    assert not (tmp_path / "nats-server.conf").exists()


def test_people_get_credentials_that_may_only_ask(tmp_path: Path) -> None:
    """For a NATS server of one's own (GKE): the people of the platform, each on a
    credential of their own that may only ask the desk; a second run keeps them."""
    out = tmp_path / "nats"
    args = ["nats-config", "--out", str(out), "--prefix", "acme"]
    people = ["--person", "alice=vision", "--person", "jane.doe=vision:admin"]
    result = CliRunner().invoke(_app(), [*args, *people])
    assert result.exit_code == 0, result.output
    config = (out / "nats-server.conf").read_text()
    assert 'user: "jane.doe"' in config
    assert '"acme_desk.alice"' in config
    alice = (out / "people" / "alice.env").read_text()
    assert "SPOTRAIN_NATS_USER=alice" in alice
    assert "SPOTRAIN_SUBJECT_PREFIX=acme" in alice
    assert (out / "people" / "alice.env").stat().st_mode & 0o077 == 0
    password = alice.split("SPOTRAIN_NATS_PASSWORD=")[1].split("\n")[0]
    again = CliRunner().invoke(_app(), [*args, "--person", "bob=nlp"])
    assert again.exit_code == 0, again.output
    assert password in (out / "people" / "alice.env").read_text(), "alice keeps her password"
    assert sorted(p.name for p in (out / "people").iterdir()) == [
        "alice.env",
        "bob.env",
        "jane.doe.env",
    ]


@pytest.mark.parametrize("person", ["alice", "alice=", "=vision", "alice=vision:root", "cli=x"])
def test_a_bad_person_is_a_one_line_error(tmp_path: Path, person: str) -> None:
    result = CliRunner().invoke(
        _app(), ["nats-config", "--out", str(tmp_path / "n"), "--person", person]
    )
    assert isinstance(result.exception, CliError), result.output
    assert result.exception.exit_code == 2
    assert "\n" not in str(result.exception)
