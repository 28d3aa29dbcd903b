"""Checkpoints: the layout, both storages behind one port, and what survives a crash mid-save."""

from __future__ import annotations

import hashlib
import math
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import google.cloud.storage as gcs  # type: ignore[import-untyped]
import pytest
from google.auth.credentials import AnonymousCredentials
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.checkpoints import (
    MANIFEST_NAME,
    CheckpointIntegrityError,
    CheckpointManifest,
    CheckpointRequest,
    CheckpointStorage,
    GcsStorage,
    LocalStorage,
    ProgressReport,
    StorageError,
    checkpoint_request_applies,
    latest_checkpoint,
    load_checkpoint,
    read_checkpoint,
    read_progress,
    save_checkpoint,
    step_folder_name,
    storage_for,
    write_progress,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
FILES = {"weights.npy": b"\x93NUMPY weights", "opt/state.json": b'{"lr": 0.1}'}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class GcsEmulator:
    """A real GCS JSON API emulator in its own process, on a free port, in memory."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "gcp_storage_emulator", "start", "--quiet", "--in-memory",
                "--host", "127.0.0.1", "--port", str(self.port)]  # fmt: skip
        self._process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.02)
        msg = f"the GCS emulator did not listen on {self.port}"
        raise RuntimeError(msg)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None

    def client(self) -> Any:
        return gcs.Client(
            project="spotrain-test",
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options={"api_endpoint": self.url},
        )


@pytest.fixture(scope="module")
def gcs_emulator() -> Iterator[GcsEmulator]:
    emulator = GcsEmulator()
    emulator.start()
    yield emulator
    emulator.stop()


@pytest.fixture
def gcs_bucket(gcs_emulator: GcsEmulator) -> Iterator[tuple[Any, str]]:
    """A client and a bucket of this test's own."""
    client = gcs_emulator.client()
    bucket = f"spotrain-{uuid.uuid4().hex[:12]}"
    client.create_bucket(bucket)
    yield client, bucket
    client.close()


@dataclass(frozen=True)
class Backend:
    storage: CheckpointStorage
    job_uri: str


@pytest.fixture(params=["local", "gcs"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Every behaviour of the port and the layout holds on both storages alike."""
    if request.param == "local":
        return Backend(LocalStorage(), f"file://{tmp_path}/jobs/job-1")
    client, bucket = request.getfixturevalue("gcs_bucket")
    return Backend(GcsStorage(bucket, client), f"gs://{bucket}/jobs/job-1")


def root_key(backend: Backend) -> str:
    return storage_for(backend.job_uri)[1]


class CrashingStorage:
    """Wraps a storage and dies after `puts_before_crash` objects, as a preempted VM would.

    Its trees go up one object at a time, as on any store that cannot rename a folder.
    """

    def __init__(self, inner: CheckpointStorage, puts_before_crash: int) -> None:
        self.inner = inner
        self.puts_left = puts_before_crash

    def put(self, key: str, data: bytes) -> None:
        if self.puts_left == 0:
            msg = "the machine went away"
            raise OSError(msg)
        self.puts_left -= 1
        self.inner.put(key, data)

    def get(self, key: str) -> bytes | None:
        return self.inner.get(key)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list_keys(self, prefix: str) -> list[str]:
        return self.inner.list_keys(prefix)

    def put_tree(self, prefix: str, objects: Mapping[str, bytes]) -> None:
        for name, data in objects.items():
            self.put(f"{prefix}/{name}", data)


def save(backend: Backend, step: int, files: Mapping[str, bytes] = FILES) -> None:
    save_checkpoint(backend.job_uri, "job-1", 1, step, files, storage=backend.storage, now=NOW)


# The storage port


def test_put_then_get_returns_the_bytes_and_a_missing_key_returns_none(backend: Backend) -> None:
    """get answers None, not an error, for an object that was never put."""
    key = f"{root_key(backend)}/a/b.bin"
    backend.storage.put(key, b"\x00\x01payload")
    assert backend.storage.get(key) == b"\x00\x01payload"
    assert backend.storage.get(f"{root_key(backend)}/a/missing.bin") is None


def test_put_replaces_the_whole_object(backend: Backend) -> None:
    """A shorter second put leaves nothing of the first behind."""
    key = f"{root_key(backend)}/object"
    backend.storage.put(key, b"a long first version")
    backend.storage.put(key, b"short")
    assert backend.storage.get(key) == b"short"


def test_list_keys_matches_by_string_prefix_not_by_folder(backend: Backend) -> None:
    """`step-` matches every step folder's objects and nothing else."""
    root = root_key(backend)
    for name in ("step-1/x", "step-2/y/z", "stepper", "other/step-3"):
        backend.storage.put(f"{root}/{name}", b"")
    assert backend.storage.list_keys(f"{root}/step-") == [f"{root}/step-1/x", f"{root}/step-2/y/z"]
    assert backend.storage.list_keys(f"{root}/nothing-here") == []


def test_delete_removes_an_object_and_ignores_a_missing_one(backend: Backend) -> None:
    """Deleting twice is not an error."""
    key = f"{root_key(backend)}/gone"
    backend.storage.put(key, b"x")
    backend.storage.delete(key)
    backend.storage.delete(key)
    assert backend.storage.get(key) is None


def test_put_tree_writes_every_object_under_the_prefix(backend: Backend) -> None:
    """Nested names become nested keys."""
    prefix = f"{root_key(backend)}/tree"
    backend.storage.put_tree(prefix, {"a": b"1", "b/c": b"2"})
    assert backend.storage.list_keys(prefix + "/") == [f"{prefix}/a", f"{prefix}/b/c"]
    assert backend.storage.get(f"{prefix}/b/c") == b"2"


def test_local_put_leaves_no_temporary_file_behind(tmp_path: Path) -> None:
    """The temporary sibling is renamed over the target, not left beside it."""
    LocalStorage().put(str(tmp_path / "deep" / "file"), b"x")
    assert [p.name for p in (tmp_path / "deep").iterdir()] == ["file"]


def test_local_put_tree_replaces_an_existing_tree_whole(tmp_path: Path) -> None:
    """A file only the old tree had does not survive into the new one."""
    prefix = str(tmp_path / "tree")
    LocalStorage().put_tree(prefix, {"old-only": b"1", "both": b"old"})
    LocalStorage().put_tree(prefix, {"both": b"new"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tree"]
    assert LocalStorage().list_keys(prefix + "/") == [f"{prefix}/both"]
    assert LocalStorage().get(f"{prefix}/both") == b"new"


def test_gcs_failures_reach_callers_as_storage_errors(gcs_bucket: tuple[Any, str]) -> None:
    """No google exception crosses the adapter: a missing bucket is an OSError to callers."""
    client, _ = gcs_bucket
    missing = GcsStorage(f"no-such-bucket-{uuid.uuid4().hex[:8]}", client)
    with pytest.raises(StorageError, match="no-such-bucket"):
        missing.list_keys("jobs/")
    with pytest.raises(OSError, match="no-such-bucket"):
        missing.put("jobs/x", b"x")


# Choosing a storage from a URI


@pytest.mark.parametrize(
    ("uri", "kind", "root"),
    [
        pytest.param("file:///data/ckpt", LocalStorage, "/data/ckpt", id="file-uri"),
        pytest.param(
            "file://localhost/data/a%20b/", LocalStorage, "/data/a b", id="file-localhost"
        ),
        pytest.param("/data/ckpt/", LocalStorage, "/data/ckpt", id="absolute-path"),
        pytest.param("gs://bucket/jobs/j1/", GcsStorage, "jobs/j1", id="gs-prefix"),
        pytest.param("gs://bucket", GcsStorage, "", id="gs-bucket-root"),
    ],
)
def test_storage_for_picks_the_storage_from_the_scheme(uri: str, kind: type, root: str) -> None:
    """The root is the key the URI names inside the chosen storage."""
    storage, found_root = storage_for(uri)
    assert isinstance(storage, kind)
    assert found_root == root


def test_storage_for_gcs_names_the_bucket() -> None:
    storage, _ = storage_for("gs://my-bucket/jobs")
    assert isinstance(storage, GcsStorage)
    assert storage.bucket_name == "my-bucket"


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        pytest.param("s3://bucket/x", "not supported", id="other-scheme"),
        pytest.param("relative/ckpt", "not supported", id="relative-path"),
        pytest.param("", "not supported", id="empty"),
        pytest.param("gs:///prefix", "names no bucket", id="gs-without-bucket"),
        pytest.param("file://otherhost/x", "remote host", id="file-on-another-host"),
    ],
)
def test_storage_for_rejects_what_it_cannot_hold(uri: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        storage_for(uri)


# Saving, finding and loading checkpoints


def test_a_saved_checkpoint_is_the_latest_and_loads_back_whole(backend: Backend) -> None:
    """The manifest records who saved it and the sha256 of every file."""
    saved = save_checkpoint(
        backend.job_uri, "job-1", 3, 40, FILES, storage=backend.storage, now=NOW
    )
    latest = latest_checkpoint(backend.job_uri, storage=backend.storage)
    assert latest == saved
    assert latest.uri == f"{backend.job_uri}/step-000000000040"
    assert latest.manifest.attempt == 3
    assert latest.manifest.created_at == NOW
    assert latest.manifest.files["weights.npy"] == hashlib.sha256(FILES["weights.npy"]).hexdigest()
    assert load_checkpoint(latest, storage=backend.storage) == FILES


def test_latest_is_none_when_nothing_was_saved(backend: Backend) -> None:
    assert latest_checkpoint(backend.job_uri, storage=backend.storage) is None


def test_latest_is_the_highest_step_whatever_the_order_of_saves(backend: Backend) -> None:
    """Steps sort as numbers (the folder names are zero-padded), not by time of saving."""
    for step in (30, 9, 100, 20):
        save(backend, step)
    latest = latest_checkpoint(backend.job_uri, storage=backend.storage)
    assert latest is not None
    assert latest.step == 100


def test_saving_a_step_again_replaces_it(backend: Backend) -> None:
    save(backend, 10, {"a": b"first"})
    save(backend, 10, {"a": b"second"})
    latest = latest_checkpoint(backend.job_uri, storage=backend.storage)
    assert latest is not None
    assert load_checkpoint(latest, storage=backend.storage) == {"a": b"second"}


def test_files_of_other_steps_and_stray_names_do_not_count(backend: Backend) -> None:
    """Only `step-<12 digits>/MANIFEST.json` marks a checkpoint."""
    save(backend, 5)
    root = root_key(backend)
    manifest = backend.storage.get(f"{root}/step-000000000005/{MANIFEST_NAME}")
    assert manifest is not None
    backend.storage.put(f"{root}/step-99/{MANIFEST_NAME}", manifest)
    backend.storage.put(f"{root}/step-000000000077/nested/{MANIFEST_NAME}", manifest)
    latest = latest_checkpoint(backend.job_uri, storage=backend.storage)
    assert latest is not None
    assert latest.step == 5


def damaged_manifests() -> list[Any]:
    valid = CheckpointManifest(job_id="j", attempt=1, step=20, created_at=NOW, files={})
    return [
        pytest.param(b"{not json", id="not-json"),
        pytest.param(b"", id="empty"),
        pytest.param(b'{"job_id": "j", "attempt": 1}', id="fields-missing"),
        pytest.param(
            valid.model_copy(update={"step": 10}).model_dump_json().encode(), id="other-step"
        ),
        pytest.param(
            valid.model_dump_json().encode().replace(b'"files":{}', b'"files":{"a":"zz"}'),
            id="sha-not-hex",
        ),
        pytest.param(None, id="no-manifest"),
    ]


@pytest.mark.parametrize("manifest", damaged_manifests())
def test_a_damaged_newest_checkpoint_is_skipped_for_the_one_before(
    backend: Backend, manifest: bytes | None
) -> None:
    """Whatever broke step 20's manifest, step 10 is what a resume gets."""
    save(backend, 10)
    save(backend, 20)
    key = f"{root_key(backend)}/step-000000000020/{MANIFEST_NAME}"
    if manifest is None:
        backend.storage.delete(key)
    else:
        backend.storage.put(key, manifest)
    latest = latest_checkpoint(backend.job_uri, storage=backend.storage)
    assert latest is not None
    assert latest.step == 10


def test_a_changed_file_fails_its_sha256_check(backend: Backend) -> None:
    """The error names the checkpoint and the file."""
    checkpoint = save_checkpoint(backend.job_uri, "job-1", 1, 7, FILES, storage=backend.storage)
    backend.storage.put(f"{root_key(backend)}/step-000000000007/weights.npy", b"bit rot")
    with pytest.raises(
        CheckpointIntegrityError, match=r"step-000000000007.*'weights\.npy'.*sha256"
    ):
        load_checkpoint(checkpoint, storage=backend.storage)


def test_a_missing_file_is_an_integrity_error(backend: Backend) -> None:
    checkpoint = save_checkpoint(backend.job_uri, "job-1", 1, 7, FILES, storage=backend.storage)
    backend.storage.delete(f"{root_key(backend)}/step-000000000007/opt/state.json")
    with pytest.raises(CheckpointIntegrityError, match=r"'opt/state\.json' is missing"):
        load_checkpoint(checkpoint, storage=backend.storage)


def test_read_checkpoint_opens_one_checkpoint_by_its_uri(backend: Backend) -> None:
    saved = save_checkpoint(backend.job_uri, "job-1", 2, 12, FILES, storage=backend.storage)
    assert read_checkpoint(saved.uri + "/", storage=backend.storage) == saved


def test_read_checkpoint_refuses_an_incomplete_one(backend: Backend) -> None:
    save(backend, 12)
    backend.storage.delete(f"{root_key(backend)}/step-000000000012/{MANIFEST_NAME}")
    with pytest.raises(CheckpointIntegrityError, match="not a complete checkpoint"):
        read_checkpoint(f"{backend.job_uri}/step-000000000012", storage=backend.storage)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(MANIFEST_NAME, id="manifest"),
        pytest.param("../escape", id="parent"),
        pytest.param("/etc/passwd", id="absolute"),
        pytest.param("a//b", id="empty-part"),
        pytest.param("a/./b", id="dot-part"),
        pytest.param("", id="empty"),
        pytest.param("a\\b", id="backslash"),
    ],
)
def test_unsafe_file_names_are_refused_before_anything_is_written(
    backend: Backend, name: str
) -> None:
    with pytest.raises(ValueError, match="not allowed"):
        save(backend, 1, {"ok": b"1", name: b"2"})
    assert backend.storage.list_keys(root_key(backend) + "/") == []


@pytest.mark.parametrize(
    "step", [pytest.param(-1, id="negative"), pytest.param(10**12, id="13-digits")]
)
def test_steps_outside_twelve_digits_are_refused(step: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        step_folder_name(step)


# Crashes mid-save


def test_a_local_save_that_fails_midway_leaves_no_trace(tmp_path: Path) -> None:
    """A real write error (a name the file system refuses) after one file was written:
    the step folder never appears, the staging folder is cleaned away, step 10 stays latest."""
    uri = f"file://{tmp_path}"
    save_checkpoint(uri, "job-1", 1, 10, FILES)
    with pytest.raises(OSError, match="too long"):
        save_checkpoint(uri, "job-1", 1, 20, {"first.bin": b"1", "x" * 300: b"2"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000000010"]
    latest = latest_checkpoint(uri)
    assert latest is not None
    assert latest.step == 10


@pytest.mark.parametrize("puts_before_crash", [0, 1, 2])
def test_a_save_cut_short_on_an_object_store_is_never_taken_for_a_checkpoint(
    backend: Backend, puts_before_crash: int
) -> None:
    """Objects appear one by one, but without the manifest (always last) nothing counts."""
    save(backend, 10)
    crashing = CrashingStorage(backend.storage, puts_before_crash)
    with pytest.raises(OSError, match="went away"):
        save_checkpoint(backend.job_uri, "job-1", 1, 20, FILES, storage=crashing)
    latest = latest_checkpoint(backend.job_uri, storage=backend.storage)
    assert latest is not None
    assert latest.step == 10


def test_a_crashed_resave_never_mixes_old_and_new_files(backend: Backend) -> None:
    """The old manifest goes first, so half-replaced files are never vouched for."""
    save(backend, 10)
    save(backend, 20, {"a": b"old", "b": b"old"})
    with pytest.raises(OSError, match="went away"):
        save_checkpoint(
            backend.job_uri,
            "job-1",
            1,
            20,
            {"a": b"new", "b": b"new"},
            storage=CrashingStorage(backend.storage, puts_before_crash=1),
        )
    latest = latest_checkpoint(backend.job_uri, storage=backend.storage)
    assert latest is not None
    assert latest.step == 10
    assert load_checkpoint(latest, storage=backend.storage) == FILES


@settings(max_examples=40, deadline=None)
@given(
    saves=st.lists(
        st.tuples(st.integers(0, 30), st.one_of(st.none(), st.integers(0, 2))),
        max_size=8,
    )
)
def test_latest_is_the_highest_step_whose_last_save_completed(
    saves: list[tuple[int, int | None]],
) -> None:
    """Property: whichever saves crashed (None = completed, n = crashed after n objects),
    latest_checkpoint finds exactly the highest step whose last save went through."""
    completed: dict[int, bool] = {}
    with tempfile.TemporaryDirectory() as folder:
        uri = f"file://{folder}"
        for step, puts_before_crash in saves:
            storage: CheckpointStorage = LocalStorage()
            if puts_before_crash is not None:
                storage = CrashingStorage(storage, puts_before_crash)
            try:
                save_checkpoint(
                    uri, "job", 1, step, {"w": bytes([step]), "o": b"o"}, storage=storage
                )
            except OSError:
                completed[step] = False
            else:
                completed[step] = True
        expected = max((step for step, ok in completed.items() if ok), default=None)
        latest = latest_checkpoint(uri)
        assert (latest.step if latest is not None else None) == expected
        if latest is not None:
            assert load_checkpoint(latest)["w"] == bytes([latest.step])


# GCS through the URI alone, as a training process reaches it


def test_a_gs_uri_alone_reaches_gcs_through_the_emulator_variable(
    gcs_emulator: GcsEmulator, gcs_bucket: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With STORAGE_EMULATOR_HOST set, storage_for builds a client that needs no credentials."""
    _, bucket = gcs_bucket
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.url)
    uri = f"gs://{bucket}/jobs/from-env"
    save_checkpoint(uri, "job-1", 1, 3, FILES)
    write_progress(
        uri, ProgressReport(job_id="job-1", attempt=1, step=3, metrics={}, updated_at=NOW)
    )
    latest = latest_checkpoint(uri)
    assert latest is not None
    assert load_checkpoint(latest) == FILES
    progress = read_progress(uri)
    assert progress is not None
    assert progress.step == 3


# Progress and checkpoint requests


def test_progress_round_trips_even_a_diverged_loss(backend: Backend) -> None:
    """NaN and infinities survive JSON, so a run that diverged can still say so."""
    report = ProgressReport(
        job_id="job-1",
        attempt=2,
        step=40,
        total_steps=100,
        metrics={"loss": math.nan, "grad_norm": math.inf, "accuracy": 0.5},
        updated_at=NOW,
    )
    write_progress(backend.job_uri, report, storage=backend.storage)
    read = read_progress(backend.job_uri, storage=backend.storage)
    assert read is not None
    assert math.isnan(read.metrics["loss"])
    assert read.model_copy(update={"metrics": {}}) == report.model_copy(update={"metrics": {}})
    assert read.metrics["grad_norm"] == math.inf
    assert read.metrics["accuracy"] == 0.5


@pytest.mark.parametrize(
    "content",
    [pytest.param(None, id="absent"), pytest.param(b"{broken", id="corrupt")],
)
def test_progress_that_is_absent_or_unreadable_reads_as_none(
    backend: Backend, content: bytes | None
) -> None:
    if content is not None:
        backend.storage.put(f"{root_key(backend)}/progress.json", content)
    assert read_progress(backend.job_uri, storage=backend.storage) is None


def request_for(attempt: int) -> bytes:
    return (
        CheckpointRequest(job_id="job-1", attempt=attempt, requested_at=NOW)
        .model_dump_json()
        .encode()
    )


@pytest.mark.parametrize(
    ("content", "applies"),
    [
        pytest.param(None, False, id="no-file"),
        pytest.param(request_for(2), True, id="this-attempt"),
        pytest.param(request_for(1), False, id="stale-from-an-earlier-attempt"),
        pytest.param(b"", True, id="touched-by-hand"),
        pytest.param(b"please", True, id="unparseable-counts"),
    ],
)
def test_a_checkpoint_request_applies_to_the_attempt_it_names(
    content: bytes | None, applies: bool
) -> None:
    assert checkpoint_request_applies(content, attempt=2) is applies
