"""Workspaces that go up through the desk (`shared.desk.UploadPart`): each part is kept in
the uploads store, which forgets what an upload left behind; the last part's ask puts the
whole zip in the workspace store under its owner's name, once it is checked whole (its
size, its hash, what it unpacks to). Parts live in the store, not in a replica's memory:
any submitter of the queue group may answer any part."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib

import structlog

from shared.desk import (
    DeskAnswer,
    UploadPart,
    part_name,
    part_offsets,
    staged_by,
    staging_refusal,
)
from shared.events.types import ObjectRef
from shared.messaging.ports import ObjectStore, Stores
from shared.workspace import (
    WorkspaceError,
    unpacked_size,
    uploads_bucket,
    workspace_object_name,
    workspaces_bucket,
)

log = structlog.get_logger()


class DeskUploads:
    def __init__(self, stores: Stores, prefix: str) -> None:
        self._stores = stores
        self._prefix = prefix
        self._beginning: dict[str, asyncio.Lock] = {}

    async def take(self, part: UploadPart, owner: str) -> DeskAnswer:
        workspaces = self._stores.store(workspaces_bucket(self._prefix))
        ref = ObjectRef(
            bucket=workspaces_bucket(self._prefix),
            name=workspace_object_name(owner, part.sha256),
            sha256=part.sha256,
            size_bytes=part.size,
        )
        if part.offset == 0 and await workspaces.has(ref.name):
            return DeskAnswer(workspace=ref)  # the owner stored this very tree before
        try:
            raw = base64.b64decode(part.data, validate=True)
        except (binascii.Error, ValueError):
            return DeskAnswer(refused="a part's data is not base64")
        if (problem := part.part_problem(raw)) is not None:
            return DeskAnswer(refused=problem)
        uploads = self._stores.store(uploads_bucket(self._prefix))
        if part.offset == 0:
            if (refusal := await self._begin(uploads, part, owner, raw)) is not None:
                return DeskAnswer(refused=refusal)
        elif not await uploads.has(part_name(owner, part.sha256, 0)):
            return DeskAnswer(refused="an upload begins with its first part: upload it again")
        else:
            await uploads.put(part_name(owner, part.sha256, part.offset), raw)
        if not part.is_last:
            return DeskAnswer()
        return await self._store_whole(part, owner, uploads, workspaces, ref)

    async def _begin(
        self, uploads: ObjectStore, part: UploadPart, owner: str, raw: bytes
    ) -> str | None:
        """Stage an upload's first part, which reserves its whole size, if the owner's
        other unfinished uploads leave room; else why not. One owner's beginnings are
        taken one at a time, so that each sees what the one before reserved."""
        async with self._beginning.setdefault(owner, asyncio.Lock()):
            staged = await uploads.list()
            name = part_name(owner, part.sha256, 0)
            # An upload begun again (the last one cut short) takes the place of its own.
            first_parts = {i.name: int(i.description or 0) for i in staged if i.name != name}
            reserved = staged_by(owner, first_parts)
            if (refusal := staging_refusal(reserved, part.size)) is not None:
                log.info("desk.upload_refused", owner=owner, staged=reserved, size=part.size)
                return refusal
            await uploads.put(name, raw, description=str(part.size))
        return None

    async def _store_whole(
        self,
        part: UploadPart,
        owner: str,
        uploads: ObjectStore,
        workspaces: ObjectStore,
        ref: ObjectRef,
    ) -> DeskAnswer:
        names = [part_name(owner, part.sha256, offset) for offset in part_offsets(part.size)]
        parts = [await uploads.get(name) for name in names]
        if any(found is None for found in parts):
            return DeskAnswer(refused="a part of the workspace is missing: upload it again")
        data = b"".join(found for found in parts if found is not None)
        try:
            if hashlib.sha256(data).hexdigest() != part.sha256 or len(data) != part.size:
                raise WorkspaceError("the workspace's parts do not make the zip it names")
            # A zip bomb stops here, before anyone unpacks it.
            await asyncio.to_thread(unpacked_size, data)
        except WorkspaceError as error:
            log.info("desk.upload_refused", owner=owner, sha256=part.sha256, reason=str(error))
            return DeskAnswer(refused=str(error))
        finally:
            for name in names:
                await uploads.delete(name)
        if not await workspaces.has(ref.name):
            await workspaces.put(ref.name, data)
        log.info("desk.uploaded", owner=owner, sha256=part.sha256, size=part.size)
        return DeskAnswer(workspace=ref)
