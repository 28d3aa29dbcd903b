"""SPOTRAIN_CHECKPOINT_DIR: a plain local folder that a script saves into as it likes
(`torch.save(state, os.path.join(dir, "snapshot.pt"))`), kept in the job's checkpoint
store (a folder locally, `gs://` on GKE) so that the next attempt, on another node, finds
it again with the latest files.

The store holds the files under `<job root>/checkpoint-dir/` and a manifest beside them,
written after the files it lists: a restore takes only what a manifest lists, so a sync cut
short by the node's loss leaves the previous complete set. A file is copied once nothing
has written to it for a moment (0.2 s) (a script half-way through writing it is not copied; one
that rewrites it every second is copied between two writes), and all that changed at the
end, once the command has exited.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from shared.checkpoints import CheckpointStorage

FOLDER_KEY: Final = "checkpoint-dir"
MANIFEST_KEY: Final = "checkpoint-dir.json"

Scan = Mapping[str, tuple[int, int]]
"""A folder's files, by path relative to it: (size in bytes, modification time in ns)."""


SETTLE_NS: Final = 200_000_000
"""How long nothing may have written to a file before it is copied while the command runs."""


def to_copy(current: Scan, copied: Scan, *, now_ns: int, final: bool) -> list[str]:
    """The files to copy to the store now: changed since they were last copied, and (but
    at the end) not written to for `SETTLE_NS`. Pure."""
    return sorted(
        name
        for name, stat in current.items()
        if copied.get(name) != stat and (final or now_ns - stat[1] >= SETTLE_NS)
    )


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_size, stat.st_mtime_ns


def scan(folder: Path) -> dict[str, tuple[int, int]]:
    found: dict[str, tuple[int, int]] = {}
    for path in folder.rglob("*"):
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue  # deleted between the listing and the look
        if path.is_file():
            found[path.relative_to(folder).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return found


class CheckpointFolder:
    """One attempt's local folder and its copy in the job's store."""

    def __init__(self, storage: CheckpointStorage, root: str, folder: Path) -> None:
        self._storage = storage
        self._root = root.rstrip("/")
        self.folder = folder
        self._copied: dict[str, tuple[int, int]] = {}
        self._listed: set[str] = set()

    def _key(self, name: str) -> str:
        return f"{self._root}/{FOLDER_KEY}/{name}"

    def restore(self) -> list[str]:
        """Bring the store's latest complete set into the folder; the names restored."""
        self.folder.mkdir(parents=True, exist_ok=True)
        raw = self._storage.get(f"{self._root}/{MANIFEST_KEY}")
        if raw is None:
            return []
        names = [str(name) for name in json.loads(raw)["files"]]
        for name in names:
            data = self._storage.get(self._key(name))
            if data is None:
                continue  # listed, then lost: the script finds what there is
            path = self.folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        self._copied = scan(self.folder)
        self._listed = set(names)
        return names

    def sync(self, *, final: bool = False) -> list[str]:
        """Copy what changed to the store, then a manifest of the folder as it is; the
        names copied. Raises OSError when the store fails (the next sync tries again)."""
        current = scan(self.folder)
        copying = to_copy(current, self._copied, now_ns=time.time_ns(), final=final)
        gone = self._listed - current.keys()
        if not copying and not gone:
            return []
        copied = []
        for name in copying:
            path = self.folder / name
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue  # deleted since the scan
            if not final and _stat(path) != current[name]:
                continue  # written to while it was read: the next sync takes it
            self._storage.put(self._key(name), data)
            self._copied[name] = current[name]
            copied.append(name)
        listed = {name for name in current if name in self._copied}
        manifest = {"files": sorted(listed)}
        self._storage.put(f"{self._root}/{MANIFEST_KEY}", json.dumps(manifest).encode())
        for name in gone:
            self._storage.delete(self._key(name))
            self._copied.pop(name, None)
        self._listed = listed
        return copied


def default_folder(tmp: str, job_id: str, attempt: int) -> Path:
    """Where an attempt's folder lives on its node: its own, so that what it finds there
    came from the store, as it will on a new node."""
    return Path(tmp, "spotrain", job_id, f"attempt-{attempt}", "checkpoint")
