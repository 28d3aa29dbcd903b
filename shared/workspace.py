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

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType

from shared.events.types import ObjectRef

DEFAULT_LIMIT_BYTES = 100 * 1024**2
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


def unpack(data: bytes, destination: Path) -> None:
    """Extract into `destination`, refusing names that would escape it."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for name in archive.namelist():
            target = (destination / name).resolve()
            if not target.is_relative_to(destination.resolve()):
                raise WorkspaceError(f"refusing {name!r}: it points outside the workspace")
        archive.extractall(destination)


def workspaces_bucket(prefix: str) -> str:
    return f"{prefix}-workspaces"


async def upload(js: JetStreamContext, prefix: str, packed: PackedWorkspace) -> ObjectRef:
    """Store the zip under its own hash: uploading the same tree twice stores it once."""
    bucket = workspaces_bucket(prefix)
    store = await js.create_object_store(
        bucket, config=ObjectStoreConfig(bucket=bucket, storage=StorageType.FILE)
    )
    name = f"{packed.sha256}.zip"
    try:
        # Named by its hash: one already stored is this very tree. Storing it again would
        # purge the old chunks, a right the CLI's NATS user does not have.
        await store.get_info(name)
    except nats.js.errors.ObjectNotFoundError:
        await store.put(name, packed.data)
    return ObjectRef(bucket=bucket, name=name, sha256=packed.sha256, size_bytes=len(packed.data))


async def download(js: JetStreamContext, ref: ObjectRef) -> bytes:
    store = await js.object_store(ref.bucket)
    result = await store.get(ref.name)
    data = result.data or b""
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        raise WorkspaceError(f"workspace {ref.name} does not match its sha256")
    return data
