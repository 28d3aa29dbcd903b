"""A workspace unpacks within its limit whatever its zip says (a zip bomb stops before it
is written out, and one whose directory lies stops as it is), and a job names only its
owner's workspace."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from services.submitter import policy
from shared.events.data import JobRequested
from shared.events.types import ObjectRef
from shared.workspace import (
    WorkspaceError,
    pack,
    unpack,
    unpacked_size,
    workspace_object_name,
    workspaces_bucket,
)


def _zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_a_zip_bomb_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    bomb = _zip({f"zeros-{i}.bin": bytes(8 * 1024**2) for i in range(4)})  # 32 MiB of zeros
    assert len(bomb) < 200 * 1024, "a few KiB that unpack to many MiB"
    with pytest.raises(WorkspaceError, match="unpacks to more than 16 MiB"):
        unpacked_size(bomb, limit_bytes=16 * 1024**2)
    with pytest.raises(WorkspaceError, match="unpacks to more than 16 MiB"):
        unpack(bomb, tmp_path, limit_bytes=16 * 1024**2)
    assert list(tmp_path.iterdir()) == []


def test_a_zip_whose_directory_lies_stops_as_it_is_written(tmp_path: Path) -> None:
    data = bytearray(_zip({"big.bin": bytes(4 * 1024**2)}))
    # The local header and the central directory both say 4 MiB; make the directory say 1 KiB.
    central = data.rfind(b"PK\x01\x02")
    size_at = central + 24  # the uncompressed size in a central directory entry
    data[size_at : size_at + 4] = (1024).to_bytes(4, "little")
    assert unpacked_size(bytes(data), limit_bytes=1024**2) == 1024
    with pytest.raises(WorkspaceError):
        unpack(bytes(data), tmp_path, limit_bytes=1024**2)


def test_a_name_that_escapes_the_workspace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        unpack(_zip({"../escape.py": b"x"}), tmp_path / "in")
    assert not (tmp_path / "escape.py").exists()


def test_what_is_packed_unpacks_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    (tmp_path / "src" / "pkg" / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "src" / "pkg" / "run.sh").chmod(0o755)
    packed = pack(tmp_path / "src")
    assert unpacked_size(packed.data) == len("print('hi')\n") + len("#!/bin/sh\n")
    unpack(packed.data, tmp_path / "out")
    assert (tmp_path / "out" / "train.py").read_text() == "print('hi')\n"
    assert (tmp_path / "out" / "pkg" / "run.sh").stat().st_mode & 0o777 == 0o755


def test_not_a_zip_is_one_clear_error() -> None:
    with pytest.raises(WorkspaceError, match="not a zip file"):
        unpacked_size(b"hello")


SHA = "a" * 64


@pytest.mark.parametrize(
    ("owner", "bucket", "name", "refused"),
    [
        pytest.param("alice", "spotrain-workspaces", f"alice.{SHA}.zip", False, id="her-own"),
        pytest.param("alice", "spotrain-workspaces", f"bob.{SHA}.zip", True, id="bobs"),
        pytest.param("alice", "spotrain-workspaces", f"{SHA}.zip", True, id="nobodys"),
        pytest.param("alice", "spotrain-uploads", f"alice.{SHA}.zip", True, id="another-store"),
        pytest.param("al", "spotrain-workspaces", f"al.ice.{SHA}.zip", True, id="a-longer-name"),
    ],
)
def test_a_job_runs_its_owners_workspace_only(
    owner: str, bucket: str, name: str, refused: bool
) -> None:
    ref = ObjectRef(bucket=bucket, name=name, sha256=SHA, size_bytes=10)
    request = JobRequested(job_id="j", owner=owner, entrypoint=("python", "t.py"), working_dir=ref)
    refusal = policy.workspace_refusal(request, workspaces_bucket("spotrain"))
    assert (refusal is not None) is refused, refusal
    assert workspace_object_name(owner, SHA) == f"{owner}.{SHA}.zip"
