"""The permission table and the configuration made from it: each role may do its work and
nothing else, as the server will read it (`tests/integration/test_nats_permissions.py`
shows the server agreeing)."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from shared.desk import person_inbox_prefix
from shared.events import CATALOG, DEFAULT_PREFIX, subject_matches
from shared.events.data import JobCancelRequested, JobRequested
from shared.localstack.stack import nats_server_binary
from shared.messaging import BusSettings
from shared.natsauth import (
    TABLE,
    BusNames,
    Role,
    TlsFiles,
    UserPermissions,
    permissions,
    read_passwords,
    replay_subjects,
    write_nats_config,
)
from shared.natsauth.files import add_person, read_people
from shared.natsauth.permissions import (
    CLIENT_REQUESTS,
    NOT_YET_PUBLISHED,
    Operates,
    person_permissions,
)
from shared.natsauth.server_config import render_server_config

NAMES = BusNames(prefix="spotrain", stream="SPOTRAIN")
USERS = permissions(NAMES)
SERVICES = (Role.SUBMITTER, Role.SCALER, Role.PREEMPTION_WATCHER, Role.CHECKPOINTER)
CONSUMERS = (*SERVICES, Role.SLACK)
API = "$JS.API"


def overlaps(a: str, b: str) -> bool:
    """Whether some subject matches both patterns."""
    left, right = a.split("."), b.split(".")
    for i in range(max(len(left), len(right))):
        if i >= len(left) or i >= len(right):
            return False
        if ">" in (left[i], right[i]):
            return True
        if "*" not in (left[i], right[i]) and left[i] != right[i]:
            return False
    return True


def publishers(pattern: str) -> set[Role]:
    """Roles allowed to publish some subject of `pattern` (denials aside)."""
    return {r for r, user in USERS.items() if any(overlaps(p, pattern) for p in user.publish_allow)}


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        pytest.param("a.b", "a.b", True, id="literal"),
        pytest.param("a.*", "a.b", True, id="star-one-token"),
        pytest.param("a.*", "a.b.c", False, id="star-not-two"),
        pytest.param("a.>", "a.b.c", True, id="tail-many"),
        pytest.param("a.>", "a", False, id="tail-needs-one"),
        pytest.param("a.*.c.>", "a.x.c.>", True, id="literal-wildcard-in-subject"),
    ],
)
def test_subjects_match_as_nats_matches_them(pattern: str, subject: str, matches: bool) -> None:
    """The model's matcher, which the table's invariants below rely on."""
    assert subject_matches(pattern, subject) is matches


@pytest.mark.parametrize(
    ("role", "subject", "allowed"),
    [
        pytest.param(Role.CLI, "spotrain.job.requested.alice", True, id="cli-requests-a-job"),
        pytest.param(Role.CLI, "spotrain.job.cancel_requested.alice", True, id="cli-cancels"),
        pytest.param(Role.CLI, "spotrain.job.accepted", False, id="cli-cannot-accept"),
        pytest.param(Role.CLI, "spotrain.pool.resized", False, id="cli-cannot-resize"),
        pytest.param(Role.CLI, "spotrain.replay.submitter", False, id="cli-cannot-replay"),
        pytest.param(Role.CLI, "$KV.spotrain-jobs.job-1", False, id="cli-cannot-write-jobs"),
        pytest.param(Role.CLI, "$O.spotrain-workspaces.C.x1", True, id="cli-uploads"),
        pytest.param(Role.CLI, f"{API}.STREAM.DELETE.SPOTRAIN", False, id="cli-cannot-delete"),
        pytest.param(
            Role.CLI, f"{API}.STREAM.PURGE.OBJ_spotrain-workspaces", False, id="cli-cannot-purge"
        ),
        pytest.param(
            Role.CLI, f"{API}.CONSUMER.CREATE.SPOTRAIN.read-1.spotrain.job.>", True, id="cli-reads"
        ),
        pytest.param(
            Role.CLI,
            f"{API}.CONSUMER.CREATE.SPOTRAIN.read-1.spotrain.pool.>",
            False,
            id="cli-cannot-read-pools",
        ),
        pytest.param(
            Role.CLI,
            f"{API}.CONSUMER.CREATE.SPOTRAIN.submitter.spotrain.job.>",
            False,
            id="cli-cannot-redefine-a-service-consumer",
        ),
        pytest.param(
            Role.CLI,
            f"{API}.CONSUMER.MSG.NEXT.SPOTRAIN.submitter",
            False,
            id="cli-cannot-take-the-submitters-messages",
        ),
        pytest.param(Role.CLI, f"{API}.CONSUMER.MSG.NEXT.SPOTRAIN.read-1", True, id="cli-pulls"),
        pytest.param(Role.SLACK, "spotrain.job.requested.bob", True, id="slack-requests-a-job"),
        pytest.param(Role.SLACK, "spotrain.replay.scaler", False, id="slack-cannot-replay"),
        pytest.param(Role.SLACK, "spotrain.dlq.slack", True, id="slack-dead-letters"),
        pytest.param(Role.SLACK, f"{API}.CONSUMER.MSG.NEXT.SPOTRAIN.slack", True, id="slack-pulls"),
        pytest.param(Role.SLACK, "$O.spotrain-workspaces.C.x1", False, id="slack-uploads-nothing"),
        pytest.param(Role.SCALER, "spotrain.pool.resized", True, id="scaler-resizes"),
        pytest.param(Role.SCALER, "spotrain.node.launched", True, id="scaler-bills-nodes"),
        pytest.param(Role.SCALER, "spotrain.job.accepted", False, id="scaler-cannot-accept"),
        pytest.param(Role.SCALER, "$KV.spotrain-pools.status", True, id="scaler-writes-pools"),
        pytest.param(Role.SCALER, "$KV.spotrain-jobs.job-1", False, id="scaler-cannot-write-jobs"),
        pytest.param(Role.SCALER, f"{API}.STREAM.DELETE.SPOTRAIN", False, id="scaler-no-delete"),
        pytest.param(Role.SCALER, "spotrain.dlq.submitter", False, id="scaler-own-dlq-only"),
        pytest.param(Role.SUBMITTER, "spotrain.job.accepted", True, id="submitter-accepts"),
        # The desk puts a person's request on the bus, on their own subject.
        pytest.param(
            Role.SUBMITTER, "spotrain.job.requested.alice", True, id="submitter-forwards-requests"
        ),
        pytest.param(Role.SUBMITTER, "$KV.spotrain-jobs.job-1", True, id="submitter-writes-jobs"),
        pytest.param(Role.SUBMITTER, "$KV.spotrain-pools.x", False, id="submitter-no-pools"),
        pytest.param(Role.CHECKPOINTER, "spotrain.job.resumed", True, id="checkpointer-resumes"),
        pytest.param(Role.CHECKPOINTER, "$KV.spotrain-jobs.j", False, id="checkpointer-reads"),
        pytest.param(Role.PREEMPTION_WATCHER, "spotrain.node.lost", True, id="watcher-loses"),
        pytest.param(Role.PREEMPTION_WATCHER, "spotrain.pool.resized", False, id="watcher-no-pool"),
        pytest.param(Role.METADATA_AGENT, "spotrain.node.preempting", True, id="agent-notices"),
        pytest.param(Role.METADATA_AGENT, "spotrain.node.lost", False, id="agent-notices-only"),
        pytest.param(
            Role.METADATA_AGENT,
            f"{API}.CONSUMER.DURABLE.CREATE.SPOTRAIN.metadata_agent",
            False,
            id="agent-consumes-nothing",
        ),
        pytest.param(Role.OPS, "spotrain.replay.submitter", True, id="ops-replays"),
        pytest.param(Role.OPS, "spotrain.job.requested", True, id="ops-imports"),
        pytest.param(Role.OPS, f"{API}.STREAM.DELETE.SPOTRAIN", True, id="ops-administers"),
        pytest.param(Role.OPS, "$KV.spotrain-jobs.job-1", False, id="ops-not-a-bucket-writer"),
    ],
)
def test_who_may_publish_what(role: Role, subject: str, allowed: bool) -> None:
    assert USERS[role].may_publish(subject) is allowed


@pytest.mark.parametrize(
    ("role", "subject", "allowed"),
    [
        pytest.param(Role.CLI, "spotrain.job.>", True, id="cli-follows-jobs"),
        pytest.param(Role.CLI, "spotrain.pool.>", False, id="cli-not-pools"),
        pytest.param(Role.CLI, "_INBOX_cli.abc.*", True, id="cli-own-replies"),
        pytest.param(Role.CLI, "_INBOX_submitter.abc.*", False, id="cli-not-others-replies"),
        pytest.param(Role.CLI, "_INBOX.abc.*", False, id="cli-not-the-shared-inbox"),
        pytest.param(Role.SUBMITTER, "spotrain.job.requested", False, id="services-pull-only"),
        pytest.param(Role.OPS, "spotrain.>", True, id="ops-tails-everything"),
    ],
)
def test_who_may_subscribe_to_what(role: Role, subject: str, allowed: bool) -> None:
    assert USERS[role].may_subscribe(subject) is allowed


def test_clients_may_publish_requests_and_cancellations_only() -> None:
    """Of all the events in the catalog; what happens to a job is the services' to say."""
    for role in (Role.CLI, Role.SLACK):
        allowed = {
            spec.model for spec in CATALOG.values() if USERS[role].may_publish(spec.subject())
        }
        assert allowed == set(CLIENT_REQUESTS) == {JobRequested, JobCancelRequested}


def test_only_the_scaler_publishes_pool_events() -> None:
    assert publishers(f"{DEFAULT_PREFIX}.pool.>") == {Role.SCALER, Role.OPS}


def test_nobody_but_ops_publishes_to_the_replay_subjects() -> None:
    assert publishers(replay_subjects(DEFAULT_PREFIX)) == {Role.OPS}


def test_nobody_but_ops_deletes_or_purges_anything() -> None:
    for verb in ("STREAM.DELETE", "STREAM.PURGE", "STREAM.MSG.DELETE", "CONSUMER.DELETE"):
        who = publishers(f"{API}.{verb}.SPOTRAIN")
        # Readers (the CLI; the scaler, for the cost metrics; the submitter, for the
        # records desk; whoever reads a bucket whole) delete their own short-lived read
        # consumers, never a service's.
        readers = {Role.CLI, Role.SCALER, Role.SUBMITTER, Role.CHECKPOINTER, Role.SLACK}
        assert who - readers == {Role.OPS}, verb
        if verb != "CONSUMER.DELETE":
            assert not who & readers - {Role.CLI}, verb
    # The submitter purges what it writes, the workspace stores, and nothing else.
    purged = {
        r for r, u in USERS.items() if u.may_publish(f"{API}.STREAM.PURGE.OBJ_spotrain-uploads")
    }
    assert purged == {Role.OPS, Role.SUBMITTER}
    assert not USERS[Role.SUBMITTER].may_publish(f"{API}.STREAM.PURGE.SPOTRAIN")
    assert not USERS[Role.SUBMITTER].may_publish(f"{API}.STREAM.PURGE.KV_spotrain-pools")
    for durable in CONSUMERS:
        subject = f"{API}.CONSUMER.DELETE.SPOTRAIN.{durable}"
        assert {r for r, u in USERS.items() if u.may_publish(subject)} == {Role.OPS}


def test_each_bucket_has_one_writer() -> None:
    assert publishers("$KV.spotrain-jobs.>") == {Role.SUBMITTER}
    assert publishers("$KV.spotrain-pools.>") == {Role.SCALER}


def test_a_services_consumer_and_dead_letters_are_its_own() -> None:
    for durable in CONSUMERS:
        for subject in (
            f"{API}.CONSUMER.MSG.NEXT.SPOTRAIN.{durable}",
            f"{API}.CONSUMER.DURABLE.CREATE.SPOTRAIN.{durable}",
            f"$JS.ACK.SPOTRAIN.{durable}.1.2.3.4.5",
            f"spotrain.dlq.{durable}",
        ):
            holders = {r for r, u in USERS.items() if u.may_publish(subject)}
            assert holders == {durable, Role.OPS}, subject


def test_every_event_has_a_publisher_or_is_known_to_have_none() -> None:
    """A new event type makes someone decide who may publish it."""
    for spec in CATALOG.values():
        who = {r for r, u in USERS.items() if u.may_publish(spec.subject())} - {Role.OPS}
        assert bool(who) is (spec.model not in NOT_YET_PUBLISHED), spec.type


def test_every_role_hears_replies_on_its_own_inbox_only() -> None:
    for role, user in USERS.items():
        inboxes = [s for s in user.subscribe_allow if s.startswith("_INBOX")]
        assert inboxes == [f"_INBOX_{role.value}.>"]


def test_the_table_has_one_row_per_role_and_one_operator() -> None:
    assert [spec.role for spec in TABLE] == list(Role)
    assert [s.role for s in TABLE if any(isinstance(g, Operates) for g in s.grants)] == [Role.OPS]


def test_subjects_follow_the_prefix_and_stream() -> None:
    users = permissions(BusNames(prefix="acme", stream="ACME_EVENTS"))
    assert users[Role.CLI].may_publish("acme.job.requested.alice")
    assert not users[Role.CLI].may_publish("spotrain.job.requested")
    assert users[Role.SCALER].may_publish("$JS.API.STREAM.INFO.ACME_EVENTS")
    assert users[Role.SCALER].may_publish("$KV.acme-pools.status")


def test_every_reason_is_said() -> None:
    """A reviewer reads why each subject is there, beside it in the configuration."""
    for user in USERS.values():
        for subjects in _all_subjects(user):
            assert all(reasons and all(reasons) for reasons in subjects.values())


def _all_subjects(user: UserPermissions) -> list[dict[str, tuple[str, ...]]]:
    return [
        dict(user.publish_allow),
        dict(user.publish_deny),
        dict(user.subscribe_allow),
        dict(user.subscribe_deny),
    ]


def test_the_server_accepts_the_written_configuration(tmp_path: Path) -> None:
    written = write_nats_config(tmp_path / "nats")
    result = subprocess.run(
        [nats_server_binary(), "-t", "--jetstream", *written.server_argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "is valid" in result.stdout + result.stderr


def test_the_configuration_holds_no_password(tmp_path: Path) -> None:
    written = write_nats_config(tmp_path / "nats")
    config = written.server_config.read_text()
    passwords = read_passwords(written.credentials)
    assert set(passwords) == set(Role)
    assert not any(password in config for password in passwords.values())
    assert "password: $SUBMITTER_PASSWORD" in config
    assert 'include "credentials.conf"' in config


def test_secrets_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    written = write_nats_config(tmp_path / "nats")
    for path in (written.credentials, *written.env_files.values()):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(written.directory.stat().st_mode) == 0o700


def test_writing_again_keeps_the_passwords_unless_rotating(tmp_path: Path) -> None:
    first = write_nats_config(tmp_path / "nats")
    again = write_nats_config(tmp_path / "nats")
    rotated = write_nats_config(tmp_path / "nats", rotate=True)
    assert first.environments == again.environments
    for role in Role:
        assert (
            rotated.env(role)["SPOTRAIN_NATS_PASSWORD"] != first.env(role)["SPOTRAIN_NATS_PASSWORD"]
        )


def test_a_roles_environment_is_what_bus_settings_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = write_nats_config(tmp_path / "nats", prefix="acme", stream="ACME_EVENTS")
    for key, value in written.env(Role.SCALER).items():
        monkeypatch.setenv(key, value)
    settings = BusSettings()
    assert settings.nats_user == "scaler"
    assert settings.nats_password is not None
    assert (
        settings.nats_password.get_secret_value()
        == read_passwords(written.credentials)[Role.SCALER]
    )
    assert settings.nats_inbox_prefix == "_INBOX_scaler"
    assert (settings.subject_prefix, settings.stream) == ("acme", "ACME_EVENTS")
    lines = written.env_files[Role.SCALER].read_text().splitlines()
    assert lines[0] == "SPOTRAIN_NATS_USER=scaler"


def test_tls_settings_pass_through(tmp_path: Path) -> None:
    tls = TlsFiles(
        cert_file=Path("/etc/nats/server.pem"),
        key_file=Path("/etc/nats/server-key.pem"),
        ca_file=Path("/etc/nats/ca.pem"),
        verify=True,
    )
    written = write_nats_config(tmp_path / "nats", tls=tls)
    config = written.server_config.read_text()
    block = config[config.index("tls {") : config.index("}", config.index("tls {")) + 1]
    assert block.splitlines() == [
        "tls {",
        '  cert_file: "/etc/nats/server.pem"',
        '  key_file: "/etc/nats/server-key.pem"',
        '  ca_file: "/etc/nats/ca.pem"',
        "  verify: true",
        "}",
    ]
    assert written.env(Role.CLI)["SPOTRAIN_NATS_TLS_CA_FILE"] == "/etc/nats/ca.pem"


def test_without_tls_there_is_no_tls_block(tmp_path: Path) -> None:
    written = write_nats_config(tmp_path / "nats")
    assert "tls {" not in written.server_config.read_text()
    assert "SPOTRAIN_NATS_TLS_CA_FILE" not in written.env(Role.CLI)


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"nats_password": "secret"}, id="password-without-user"),
        pytest.param({"nats_tls_cert_file": "/c.pem"}, id="certificate-without-key"),
    ],
)
def test_half_an_identity_is_a_settings_error(fields: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        BusSettings.model_validate(fields)


ALICE = person_permissions("alice", NAMES)


@pytest.mark.parametrize(
    ("subject", "allowed"),
    [
        # She asks the desk, which puts her requests on the bus under her name: nothing she
        # sends is stored as she sent it, under an id she chose.
        pytest.param("spotrain.job.requested.alice", False, id="no-request-of-her-own"),
        pytest.param("spotrain.job.cancel_requested.alice", False, id="no-cancel-of-her-own"),
        pytest.param("spotrain.job.requested.bob", False, id="not-as-bob"),
        pytest.param("$O.spotrain-workspaces.C.x1", False, id="uploads-through-the-desk"),
        pytest.param("spotrain.job.accepted", False, id="decides-nothing"),
        # No JetStream API at all: no route makes the server publish for her (a direct
        # get's or a consumer's reply goes where its asker says), no stream to create.
        pytest.param(f"{API}.DIRECT.GET.OBJ_spotrain-workspaces", False, id="no-direct-get"),
        pytest.param(f"{API}.STREAM.CREATE.OBJ_spotrain-workspaces", False, id="no-stream"),
        pytest.param(f"{API}.CONSUMER.MSG.NEXT.SPOTRAIN.submitter", False, id="no-pull"),
        pytest.param(f"{API}.STREAM.NAMES", False, id="no-listing"),
        pytest.param("spotrain_desk.alice", True, id="asks-the-desk-as-herself"),
    ],
)
def test_a_person_publishes_on_her_desk_subject_only(subject: str, allowed: bool) -> None:
    assert ALICE.may_publish(subject) is allowed
    assert set(ALICE.publish_allow) == {"spotrain_desk.alice"}


def test_a_person_hears_replies_in_their_own_inbox_and_no_job_events() -> None:
    assert set(ALICE.subscribe_allow) == {f"{person_inbox_prefix('alice')}.>"}
    assert not ALICE.may_subscribe(f"{person_inbox_prefix('jane.doe')}.x")
    assert not ALICE.may_subscribe("_INBOX_cli.x")
    assert not ALICE.may_subscribe("spotrain.job.accepted")
    # A name with a dot gets an inbox that no shorter name's covers.
    assert not person_permissions("jane", NAMES).may_subscribe(
        f"{person_inbox_prefix('jane.doe')}.x"
    )


@pytest.mark.parametrize(
    ("subject", "allowed"),
    [
        # Records and job events hold every job's --env values: the desk reads for her.
        pytest.param(f"{API}.STREAM.MSG.GET.KV_spotrain-jobs", False, id="not-the-jobs-bucket"),
        pytest.param(f"{API}.DIRECT.GET.KV_spotrain-jobs.x", False, id="not-directly-either"),
        pytest.param(f"{API}.CONSUMER.CREATE.KV_spotrain-jobs", False, id="nor-listing-it"),
        pytest.param(
            f"{API}.CONSUMER.CREATE.SPOTRAIN.read-1.spotrain.job.>", False, id="no-job-events"
        ),
        pytest.param(
            f"{API}.CONSUMER.CREATE.SPOTRAIN.read-1.spotrain.node.>", False, id="node-events"
        ),
        pytest.param(f"{API}.STREAM.MSG.GET.KV_spotrain-pools", False, id="the-pools"),
        pytest.param("spotrain_desk.alice", True, id="asks-the-desk-as-herself"),
        pytest.param("spotrain_desk.bob", False, id="not-as-bob"),
        pytest.param("spotrain_desk.alice.doe", False, id="not-as-alice-doe"),
    ],
)
def test_a_person_reads_jobs_through_the_desk_only(subject: str, allowed: bool) -> None:
    assert ALICE.may_publish(subject) is allowed


def test_only_the_submitter_answers_the_desk_and_it_replies_to_any_inbox() -> None:
    answering = {r for r, u in USERS.items() if u.may_subscribe("spotrain_desk.alice")}
    assert answering == {Role.SUBMITTER}
    assert {r for r, u in USERS.items() if u.allow_responses} == {Role.SUBMITTER}
    config = render_server_config(USERS, prefix="spotrain", stream="SPOTRAIN")
    submitter = config.split("# submitter:")[1].split("# scaler:")[0]
    assert "allow_responses: true" in submitter
    assert config.count("allow_responses") == 1


@pytest.mark.parametrize(
    ("name", "says"),
    [
        pytest.param("cli", "a service's or a client role's name", id="a-role"),
        pytest.param("al ice", "'al ice' is not a name", id="a-space"),
        pytest.param("-alice", "'-alice' is not a name", id="a-leading-dash"),
        pytest.param("alice", "team 'no team' is not a name", id="a-bad-team"),
    ],
)
def test_a_person_needs_a_name_of_their_own(tmp_path: Path, name: str, says: str) -> None:
    team = "no team" if "team" in says else "vision"
    with pytest.raises(ValueError, match=says):
        add_person(tmp_path, name, team=team)
    assert read_people(tmp_path) == {}


def test_the_server_accepts_a_configuration_with_people(tmp_path: Path) -> None:
    """Roles and people in one configuration; adding again replaces the password."""
    first = add_person(tmp_path / "nats", "jane.doe@acme.com", team="vision", admin=True)
    again = add_person(tmp_path / "nats", "jane.doe@acme.com", team="vision", admin=True)
    assert first.password != again.password
    add_person(tmp_path / "nats", "bob", team="nlp")
    written = write_nats_config(tmp_path / "nats")
    text = written.server_config.read_text()
    assert 'user: "jane.doe@acme.com"' in text
    assert '"spotrain_desk.jane.doe@acme.com"' in text
    assert again.password in (tmp_path / "nats" / "credentials.conf").read_text()
    assert first.password not in (tmp_path / "nats" / "credentials.conf").read_text()
    assert stat.S_IMODE((tmp_path / "nats" / "people.json").stat().st_mode) == 0o600
    result = subprocess.run(
        [nats_server_binary(), "-t", "--jetstream", *written.server_argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr
