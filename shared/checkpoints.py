"""Checkpoints and progress of a training job, on local disk or in GCS: the layout, the storage
port it is written through, and the functions that save, find, verify and load checkpoints.
Imports no nats, ray or structlog, so a training process pays only for pydantic."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Final, Protocol
from urllib.parse import unquote, urlsplit

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

MANIFEST_NAME: Final = "MANIFEST.json"
PROGRESS_NAME: Final = "progress.json"
CHECKPOINT_REQUEST_NAME: Final = "CHECKPOINT_NOW"
STEP_FOLDER_PREFIX: Final = "step-"
MAX_STEP: Final = 10**12 - 1  # the folder name holds twelve digits, so names sort by step

_STEP_FOLDER = re.compile(r"step-([0-9]{12})")

Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class CheckpointManifest(BaseModel):
    """Written last into a checkpoint's folder: its presence is what makes the checkpoint exist."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    attempt: int = Field(ge=1)
    step: int = Field(ge=0, le=MAX_STEP)
    created_at: AwareDatetime
    files: dict[str, Sha256Hex]


class Checkpoint(BaseModel):
    """A complete checkpoint: where its folder is and what its manifest says."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    uri: str
    step: int
    manifest: CheckpointManifest


class ProgressReport(BaseModel):
    """The latest progress of a job, overwritten at its root on every report."""

    # A diverged run reports a NaN loss; JSON's default null would not read back as a float.
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")

    job_id: str
    attempt: int = Field(ge=1)
    step: int = Field(ge=0)
    total_steps: int | None = Field(default=None, ge=0)
    metrics: dict[str, float]
    updated_at: AwareDatetime
    workers: int | None = Field(default=None, ge=1)
    """How many workers the run has now (a multi-node run's world size): how the platform
    sees an elastic job shrink and grow."""


class CheckpointRequest(BaseModel):
    """The platform's ask, written as CHECKPOINT_NOW at a job's root, to checkpoint and stop."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str
    attempt: int = Field(ge=1)
    requested_at: AwareDatetime
    moving: bool = False
    """The platform stops the attempt to go on on other capacity (its deadline policy), not
    because its node goes: its end is a move, not a loss."""
    save_by: AwareDatetime | None = None
    """When the node goes (the notice's deadline: 15 s on GKE by default, up to 105 s with
    the longer shutdown grace): what is not saved by then is lost. None: no node goes."""


class StopAsk(StrEnum):
    """What a CHECKPOINT_NOW file asks of one attempt."""

    NONE = "none"
    STOP = "stop"
    """Checkpoint and stop: its node is being taken back."""
    MOVE = "move"
    """Checkpoint and stop: the platform moves the job to other capacity."""


class CheckpointIntegrityError(Exception):
    """A checkpoint's files do not match its manifest, or it has no valid manifest."""


class StorageError(OSError):
    """A remote store failed (after its client's own retries); worth retrying later."""


class CheckpointStorage(Protocol):
    """Flat object storage addressed by string keys, as GCS is; a local folder tree acts alike.

    - `put` is atomic per object: a reader sees the whole old object or the whole new one.
    - `get` returns None for a missing object; it never returns part of one.
    - `list_keys` matches keys by string prefix (not by folder) and sees every completed put.
    - `delete` of a missing object is not an error.
    - `put_tree` writes a group of objects under one prefix in the order given. Where the
      backend can (a local file system) the group appears all at once and a failure leaves
      nothing visible; elsewhere objects appear one by one, so a caller that needs a commit
      point writes its marker last.
    - Failures raise OSError (StorageError for a remote store): the caller may retry later.
    """

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes | None: ...

    def delete(self, key: str) -> None: ...

    def list_keys(self, prefix: str) -> list[str]: ...

    def put_tree(self, prefix: str, objects: Mapping[str, bytes]) -> None: ...


class LocalStorage:
    """Keys are absolute paths. Each file is written beside its target then renamed over it."""

    def put(self, key: str, data: bytes) -> None:
        path = Path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as temp:
                temp.write(data)
                temp.flush()
                os.fsync(temp.fileno())
            os.replace(temp_name, path)
        except BaseException:
            Path(temp_name).unlink(missing_ok=True)
            raise
        _fsync_folder(path.parent)

    def get(self, key: str) -> bytes | None:
        try:
            return Path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            Path(key).unlink()

    def list_keys(self, prefix: str) -> list[str]:
        # A prefix such as "/ckpt/step-" names no folder: walk its parent, prune what cannot match.
        base = Path(prefix) if prefix.endswith("/") else Path(prefix).parent
        keys: list[str] = []
        for folder, subfolders, files in os.walk(base):
            subfolders[:] = [
                name for name in subfolders if _may_match(os.path.join(folder, name) + "/", prefix)
            ]
            keys.extend(
                path for name in files if (path := os.path.join(folder, name)).startswith(prefix)
            )
        return sorted(keys)

    def put_tree(self, prefix: str, objects: Mapping[str, bytes]) -> None:
        """Stage the tree in a hidden sibling folder, then rename it into place in one step."""
        final = Path(prefix)
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".tmp"))
        try:
            for name, data in objects.items():
                self._write_new(staging / name, data)
            _fsync_folder(staging)
            if final.exists():
                self._replace_folder(staging, final)
            else:
                staging.rename(final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _fsync_folder(final.parent)

    def _replace_folder(self, staging: Path, final: Path) -> None:
        """rename(2) cannot replace a non-empty folder: move the old one aside first."""
        aside = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".old"))
        old = aside / final.name
        final.rename(old)
        try:
            staging.rename(final)
        except BaseException:
            old.rename(final)
            raise
        finally:
            shutil.rmtree(aside, ignore_errors=True)

    def _write_new(self, path: Path, data: bytes) -> None:
        """Write one file of a staged tree; nobody can see it yet, so no rename is needed."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("xb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())


def _may_match(folder: str, prefix: str) -> bool:
    return folder.startswith(prefix) or prefix.startswith(folder)


def _fsync_folder(folder: Path) -> None:
    """Make a rename durable: a spot VM may lose power right after we report a save."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class GcsStorage:
    """Keys are object names in one bucket, through the official google-cloud-storage client.

    GCS replaces an object in one step and lists with strong consistency, which is what the
    port promises. The client is imported and built on first use, never at import time, so
    a local job never loads it (hence the imports inside methods).
    """

    def __init__(self, bucket: str, client: Any = None) -> None:
        # `Any`: google-cloud-storage ships no type information.
        self.bucket_name = bucket
        self._client: Any = client
        self._bucket: Any = None

    def put(self, key: str, data: bytes) -> None:
        from google.cloud.storage.retry import DEFAULT_RETRY  # type: ignore[import-untyped]  # noqa: PLC0415

        with self._translated_errors(key):
            # Rewriting an object with the same bytes is harmless, so uploads may be retried.
            self._blob(key).upload_from_string(
                data, content_type="application/octet-stream", retry=DEFAULT_RETRY
            )

    def get(self, key: str) -> bytes | None:
        from google.api_core.exceptions import NotFound  # noqa: PLC0415

        with self._translated_errors(key):
            try:
                return bytes(self._blob(key).download_as_bytes())
            except NotFound:
                return None

    def delete(self, key: str) -> None:
        from google.api_core.exceptions import NotFound  # noqa: PLC0415

        with self._translated_errors(key), contextlib.suppress(NotFound):
            self._blob(key).delete()

    def list_keys(self, prefix: str) -> list[str]:
        with self._translated_errors(prefix):
            return sorted(
                str(blob.name) for blob in self._bucket_handle().list_blobs(prefix=prefix)
            )

    def put_tree(self, prefix: str, objects: Mapping[str, bytes]) -> None:
        """GCS has no rename of many objects: they appear one by one, in the order given."""
        for name, data in objects.items():
            self.put(_child(prefix, name), data)

    def _blob(self, key: str) -> Any:
        return self._bucket_handle().blob(key)

    def _bucket_handle(self) -> Any:
        if self._bucket is None:
            if self._client is None:
                # The from-form trips mypy when typed google-cloud-container shares the namespace.
                import google.cloud.storage as storage  # type: ignore[import-untyped]  # noqa: PLC0415, PLR0402

                self._client = storage.Client()
            self._bucket = self._client.bucket(self.bucket_name)
        return self._bucket

    @contextlib.contextmanager
    def _translated_errors(self, key: str) -> Iterator[None]:
        """No google exception leaves the adapter; callers handle OSError alone."""
        from google.api_core.exceptions import GoogleAPIError  # noqa: PLC0415
        from google.auth.exceptions import GoogleAuthError  # noqa: PLC0415

        try:
            yield
        except (GoogleAPIError, GoogleAuthError) as error:
            msg = f"gs://{self.bucket_name}/{key}: {error}"
            raise StorageError(msg) from error


def storage_for(uri: str) -> tuple[CheckpointStorage, str]:
    """The storage that holds `uri`, and the key `uri` names in it.

    `file:///abs/path` and `/abs/path` → LocalStorage and the path; `gs://bucket/prefix` →
    GcsStorage for the bucket and the prefix. Anything else is a ValueError.
    """
    bucket, root = _parse(uri)
    storage: CheckpointStorage = LocalStorage() if bucket is None else GcsStorage(bucket)
    return storage, root


def _parse(uri: str) -> tuple[str | None, str]:
    """(bucket, key) for a gs:// URI, (None, absolute path) for a local one."""
    parts = urlsplit(uri)
    if parts.scheme == "gs":
        if not parts.netloc:
            msg = f"checkpoint URI {uri!r} names no bucket: expected gs://BUCKET/PREFIX"
            raise ValueError(msg)
        return parts.netloc, parts.path.strip("/")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            msg = f"checkpoint URI {uri!r} names a remote host: expected file:///ABSOLUTE/PATH"
            raise ValueError(msg)
        return None, str(PurePosixPath(unquote(parts.path)))
    if parts.scheme == "" and uri.startswith("/"):
        return None, str(PurePosixPath(uri))
    msg = (
        f"checkpoint URI {uri!r} is not supported: use file:///ABSOLUTE/PATH, "
        "an absolute path, or gs://BUCKET/PREFIX"
    )
    raise ValueError(msg)


def _child(parent: str, name: str) -> str:
    """Join a key or URI and a relative name with exactly one slash."""
    if not parent:
        return name
    return parent + name if parent.endswith("/") else f"{parent}/{name}"


def _resolve(uri: str, storage: CheckpointStorage | None) -> tuple[CheckpointStorage, str]:
    """The caller's storage (a test's fake, a context's cached client) or the URI's own."""
    if storage is None:
        return storage_for(uri)
    return storage, _parse(uri)[1]


def step_folder_name(step: int) -> str:
    """`step-000000000042`: zero-padded so that names sort as steps do."""
    if not 0 <= step <= MAX_STEP:
        msg = f"step {step} is outside 0..{MAX_STEP}"
        raise ValueError(msg)
    return f"{STEP_FOLDER_PREFIX}{step:012d}"


def _check_file_name(name: str) -> None:
    parts = name.split("/")
    if (
        name == MANIFEST_NAME
        or name.startswith("/")
        or "\\" in name
        or "\0" in name
        or any(part in ("", ".", "..") for part in parts)
    ):
        msg = (
            f"checkpoint file name {name!r} is not allowed: use a relative name whose parts "
            f"are not empty, '.' or '..', other than {MANIFEST_NAME}"
        )
        raise ValueError(msg)


def save_checkpoint(
    uri: str,
    job_id: str,
    attempt: int,
    step: int,
    files: Mapping[str, bytes],
    *,
    storage: CheckpointStorage | None = None,
    now: datetime | None = None,
) -> Checkpoint:
    """Save `files` as the checkpoint of `step` under the job's `uri`, and return it.

    The manifest goes last, so a crash at any point leaves either the whole checkpoint or one
    that `latest_checkpoint` skips. Saving a step again replaces that checkpoint.
    """
    for name in files:
        _check_file_name(name)
    store, root = _resolve(uri, storage)
    folder = step_folder_name(step)
    manifest = CheckpointManifest(
        job_id=job_id,
        attempt=attempt,
        step=step,
        created_at=now if now is not None else datetime.now(UTC),
        files={name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
    )
    prefix = _child(root, folder)
    # An old manifest must not vouch for files that are about to be overwritten.
    store.delete(_child(prefix, MANIFEST_NAME))
    store.put_tree(prefix, {**files, MANIFEST_NAME: manifest.model_dump_json().encode()})
    return Checkpoint(uri=_child(uri.rstrip("/"), folder), step=step, manifest=manifest)


def read_checkpoint(uri: str, *, storage: CheckpointStorage | None = None) -> Checkpoint:
    """The checkpoint whose folder is `uri`; CheckpointIntegrityError when it is not complete."""
    store, root = _resolve(uri, storage)
    manifest = _read_manifest(store, _child(root, MANIFEST_NAME))
    if manifest is None:
        msg = f"{uri} is not a complete checkpoint: no valid {MANIFEST_NAME}"
        raise CheckpointIntegrityError(msg)
    return Checkpoint(uri=uri.rstrip("/"), step=manifest.step, manifest=manifest)


def latest_checkpoint(uri: str, *, storage: CheckpointStorage | None = None) -> Checkpoint | None:
    """The complete checkpoint with the highest step under the job's `uri`, if any.

    Folders without a manifest, or whose manifest does not parse or names another step, are
    skipped: they are saves that crashed, or damage, and an older checkpoint serves instead.
    """
    store, root = _resolve(uri, storage)
    folders_prefix = _child(root, "")
    steps: list[tuple[int, str]] = []
    for key in store.list_keys(_child(root, STEP_FOLDER_PREFIX)):
        folder, _, name = key.removeprefix(folders_prefix).partition("/")
        if name == MANIFEST_NAME and (match := _STEP_FOLDER.fullmatch(folder)):
            steps.append((int(match.group(1)), folder))
    for step, folder in sorted(steps, reverse=True):
        manifest = _read_manifest(store, _child(_child(root, folder), MANIFEST_NAME))
        if manifest is not None and manifest.step == step:
            return Checkpoint(uri=_child(uri.rstrip("/"), folder), step=step, manifest=manifest)
    return None


def _read_manifest(store: CheckpointStorage, key: str) -> CheckpointManifest | None:
    raw = store.get(key)
    if raw is None:
        return None
    try:
        return CheckpointManifest.model_validate_json(raw)
    except ValidationError:
        return None


def load_checkpoint(
    checkpoint: Checkpoint, *, storage: CheckpointStorage | None = None
) -> dict[str, bytes]:
    """Every file of `checkpoint`, each checked against its sha256 in the manifest.

    Raises CheckpointIntegrityError naming the file when one is missing or differs.
    """
    store, root = _resolve(checkpoint.uri, storage)
    files: dict[str, bytes] = {}
    for name, expected in checkpoint.manifest.files.items():
        data = store.get(_child(root, name))
        if data is None:
            msg = f"checkpoint {checkpoint.uri}: file {name!r} is missing"
            raise CheckpointIntegrityError(msg)
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            msg = (
                f"checkpoint {checkpoint.uri}: file {name!r} has sha256 {actual}, "
                f"but the manifest says {expected}"
            )
            raise CheckpointIntegrityError(msg)
        files[name] = data
    return files


def write_progress(
    uri: str, report: ProgressReport, *, storage: CheckpointStorage | None = None
) -> None:
    """Replace the job's progress.json with `report`."""
    store, root = _resolve(uri, storage)
    store.put(_child(root, PROGRESS_NAME), report.model_dump_json().encode())


def read_progress(uri: str, *, storage: CheckpointStorage | None = None) -> ProgressReport | None:
    """The job's last progress report; None when there is none yet or it does not parse."""
    store, root = _resolve(uri, storage)
    raw = store.get(_child(root, PROGRESS_NAME))
    if raw is None:
        return None
    try:
        return ProgressReport.model_validate_json(raw)
    except ValidationError:
        return None


LOGS_FOLDER = "logs"
KEPT_LOG_BYTES = 1024 * 1024
"""How much of an attempt's output the platform keeps beside its checkpoints: the end of
it, where a failure says why."""


def attempt_log_key(attempt: int) -> str:
    return f"{LOGS_FOLDER}/attempt-{attempt}.log"


def write_attempt_log(
    uri: str, attempt: int, output: bytes, *, storage: CheckpointStorage | None = None
) -> None:
    """Keep what the attempt printed so far (its last `KEPT_LOG_BYTES`) in the job's store:
    readable after Ray lost it (a head back without its state, a node gone)."""
    store, root = _resolve(uri, storage)
    store.put(_child(root, attempt_log_key(attempt)), output[-KEPT_LOG_BYTES:])


def read_attempt_log(
    uri: str, attempt: int, *, storage: CheckpointStorage | None = None
) -> str | None:
    """What the job's store kept of an attempt's output; None when it kept nothing."""
    store, root = _resolve(uri, storage)
    raw = store.get(_child(root, attempt_log_key(attempt)))
    return raw.decode(errors="replace") if raw is not None else None


def request_checkpoint(
    uri: str, request: CheckpointRequest, *, storage: CheckpointStorage | None = None
) -> None:
    """Ask the job's running attempt to checkpoint and stop, by writing CHECKPOINT_NOW."""
    store, root = _resolve(uri, storage)
    store.put(_child(root, CHECKPOINT_REQUEST_NAME), request.model_dump_json().encode())


def checkpoint_request_applies(raw: bytes | None, attempt: int) -> bool:
    """Whether a CHECKPOINT_NOW file's content asks `attempt` to stop. Pure: no I/O."""
    return stop_ask(raw, attempt) is not StopAsk.NONE


def stop_ask(raw: bytes | None, attempt: int) -> StopAsk:
    """What a CHECKPOINT_NOW file's content asks of `attempt`. Pure: no I/O.

    A request names its attempt, so the file left behind by a preempted attempt does not stop
    the next one. A file that does not parse (someone ran `touch CHECKPOINT_NOW`) counts.
    """
    if raw is None:
        return StopAsk.NONE
    try:
        request = CheckpointRequest.model_validate_json(raw)
    except ValidationError:
        return StopAsk.STOP
    if request.attempt != attempt:
        return StopAsk.NONE
    return StopAsk.MOVE if request.moving else StopAsk.STOP


def save_by(raw: bytes | None, attempt: int) -> datetime | None:
    """When a CHECKPOINT_NOW file's content says `attempt` must have saved by, if it says.
    Pure: no I/O."""
    if raw is None:
        return None
    try:
        request = CheckpointRequest.model_validate_json(raw)
    except ValidationError:
        return None
    return request.save_by if request.attempt == attempt else None


def read_checkpoint_request(uri: str, *, storage: CheckpointStorage | None = None) -> bytes | None:
    """The raw CHECKPOINT_NOW file at the job's root, or None."""
    store, root = _resolve(uri, storage)
    return store.get(_child(root, CHECKPOINT_REQUEST_NAME))
