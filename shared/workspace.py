"""A job's working directory as one zip in the bus's object store: packed by the client,
unpacked by the submitter, wherever each runs.

Packing respects `.gitignore` and `.spotrainignore` patterns (a useful subset: globs,
directory patterns, no negation) and refuses a folder over the size limit.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from shared.events.types import ObjectRef
from shared.messaging.ports import ObjectStoreMissingError, Stores

DEFAULT_LIMIT_BYTES = 100 * 1024**2
"""The most a workspace holds, packed or unpacked."""
MAX_FILES = 100_000
UPLOADS_MAX_AGE_S = 3600.0
"""How long a part of an upload through the desk is kept, should its upload never end."""
ALWAYS_IGNORED = (".git/", ".hg/", ".venv/", "venv/", "__pycache__/", "*.pyc", ".mypy_cache/",
                  ".pytest_cache/", ".ruff_cache/", ".ipynb_checkpoints/")  # fmt: skip


class WorkspaceError(ValueError):
    """A working directory that cannot be packed or unpacked; the message says why."""


@dataclass(frozen=True)
class PackedWorkspace:
    data: bytes
    sha256: str
    files: int


def ignore_patterns(root: Path) -> list[str]:
    patterns = list(ALWAYS_IGNORED)
    for name in (".gitignore", ".spotrainignore"):
        path = root / name
        if path.is_file():
            for raw_line in path.read_text(errors="replace").splitlines():
                line = raw_line.strip()
                if line and not line.startswith(("#", "!")):
                    patterns.append(line)
    return patterns


def is_ignored(relative: PurePosixPath, is_dir: bool, patterns: list[str]) -> bool:
    for pattern in patterns:
        dir_only = pattern.endswith("/")
        glob = pattern.rstrip("/").lstrip("/")
        if dir_only and not is_dir:
            continue
        anchored = "/" in glob
        if anchored and fnmatch.fnmatch(str(relative), glob):
            return True
        if not anchored and fnmatch.fnmatch(relative.name, glob):
            return True
    return False


def pack(root: Path, *, limit_bytes: int = DEFAULT_LIMIT_BYTES) -> PackedWorkspace:
    """Zip `root` deterministically (sorted names, fixed timestamps) so equal trees hash equal."""
    if not root.is_dir():
        raise WorkspaceError(f"{root} is not a directory")
    patterns = ignore_patterns(root)
    files: list[tuple[PurePosixPath, Path]] = []
    total = 0
    stack = [root]
    while stack:
        folder = stack.pop()
        for entry in sorted(folder.iterdir()):
            relative = PurePosixPath(entry.relative_to(root).as_posix())
            if entry.is_symlink() or is_ignored(relative, entry.is_dir(), patterns):
                continue
            if entry.is_dir():
                stack.append(entry)
            elif entry.is_file():
                total += entry.stat().st_size
                if total > limit_bytes:
                    raise WorkspaceError(
                        f"{root} holds more than {limit_bytes // 1024**2} MiB after ignore rules; "
                        "add large files to .spotrainignore and load data from storage"
                    )
                files.append((relative, entry))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for relative, path in sorted(files):
            info = zipfile.ZipInfo(str(relative), date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (path.stat().st_mode & 0o777) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    data = buffer.getvalue()
    return PackedWorkspace(data=data, sha256=hashlib.sha256(data).hexdigest(), files=len(files))


def unpacked_size(data: bytes, *, limit_bytes: int = DEFAULT_LIMIT_BYTES) -> int:
    """What `data` holds once unpacked, as its zip directory says; a WorkspaceError for a
    zip that is not one, holds too many files, or says it unpacks past `limit_bytes` (a
    zip bomb: a few MiB that expand to GBs). `unpack` counts again as it writes: a
    directory may lie."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError) as error:
        raise WorkspaceError(f"a workspace is not a zip file: {error}") from None
    if len(entries) > MAX_FILES:
        raise WorkspaceError(f"a workspace holds {len(entries)} files; at most {MAX_FILES}")
    total = sum(entry.file_size for entry in entries)
    if total > limit_bytes:
        raise WorkspaceError(_too_big(total, limit_bytes))
    return total


def unpack(data: bytes, destination: Path, *, limit_bytes: int = DEFAULT_LIMIT_BYTES) -> None:
    """Extract into `destination`, refusing names that would escape it and, whatever the
    zip's directory says, more than `limit_bytes` written in all."""
    unpacked_size(data, limit_bytes=limit_bytes)
    root = destination.resolve()
    written = 0
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        entries = archive.infolist()
        for entry in entries:
            target = (destination / entry.filename).resolve()
            if not target.is_relative_to(root):
                raise WorkspaceError(
                    f"refusing {entry.filename!r}: it points outside the workspace"
                )
        for entry in entries:
            target = root / entry.filename
            if entry.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(entry) as source, target.open("wb") as sink:
                try:
                    while chunk := source.read(1024**2):
                        written += len(chunk)
                        if written > limit_bytes:
                            raise WorkspaceError(_too_big(written, limit_bytes))
                        sink.write(chunk)
                except zipfile.BadZipFile as error:  # a size or CRC that lies
                    raise WorkspaceError(f"a workspace's zip is damaged: {error}") from None
            if mode := (entry.external_attr >> 16) & 0o777:
                target.chmod(mode)


def _too_big(size: int, limit_bytes: int) -> str:
    return (
        f"a workspace unpacks to more than {limit_bytes // 1024**2} MiB "
        f"({size // 1024**2} MiB or more); add large files to .spotrainignore"
    )


def workspace_object_name(owner: str, sha256: str) -> str:
    """Where the platform keeps an owner's workspace: under their own name, so a job can
    only name its owner's code, never another's of the same content."""
    return f"{owner}.{sha256}.zip"


def uploads_bucket(prefix: str) -> str:
    """Where a person's workspace waits in parts while it goes up through the desk; parts
    left behind expire (`UPLOADS_MAX_AGE_S`)."""
    return f"{prefix}-uploads"


def workspaces_bucket(prefix: str) -> str:
    return f"{prefix}-workspaces"


async def declare_stores(stores: Stores, prefix: str) -> None:
    """The workspace stores, declared by their writer (the submitter) at start: never on
    first use, by whoever comes first with a configuration of their own."""
    await stores.declare_store(workspaces_bucket(prefix))
    await stores.declare_store(uploads_bucket(prefix), ttl_s=UPLOADS_MAX_AGE_S)


async def upload(stores: Stores, prefix: str, packed: PackedWorkspace, owner: str) -> ObjectRef:
    """Store the zip under its owner's name and its hash: the same tree twice is stored
    once. For a role's credential; a person's goes up through the records desk. The store
    rides out a cluster's leader election."""
    bucket = workspaces_bucket(prefix)
    name = workspace_object_name(owner, packed.sha256)
    store = stores.store(bucket)
    try:
        # Named by its hash: one already stored is this very tree (a try cut short before
        # its last chunk left no object). Storing it again would purge the old chunks, a
        # right the CLI's NATS user does not have.
        if not await store.has(name):
            await store.put(name, packed.data)
    except ObjectStoreMissingError:
        msg = "there is no workspace store yet: the submitter declares it when it starts"
        raise WorkspaceError(msg) from None
    return ObjectRef(bucket=bucket, name=name, sha256=packed.sha256, size_bytes=len(packed.data))


async def download(stores: Stores, ref: ObjectRef) -> bytes:
    data = await stores.store(ref.bucket).get(ref.name)
    if data is None:
        raise WorkspaceError(f"workspace {ref.name} is not in the store")
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        raise WorkspaceError(f"workspace {ref.name} does not match its sha256")
    return data
