"""`RayJobs` on Ray's Job Submission API (the dashboard's REST API, through Ray's SDK).

The SDK is synchronous; each call runs in a worker thread so the event loop stays free.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from services.submitter.model import RayJobState, RayJobStatus, SubmissionPlan
from shared.ray_head import RayHeadUnavailableError, head_unavailable
from shared.resources import NODE_LABEL, POOL_LABEL

T = TypeVar("T")

TRAIN_WORKER_CLASS = "RayTrainWorker"
"""The actor class of each Ray Train worker (Train v2's worker group)."""

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient


class RayJobSubmission:
    def __init__(self, address: str) -> None:
        self._address = address
        self._client: JobSubmissionClient | None = None
        self._node_names: dict[str, tuple[str | None, str | None]] = {}
        """Ray node id → the platform's node and pool names; a node keeps its labels."""

    def _connect(self) -> JobSubmissionClient:
        # Imported here: Ray takes half a second to import, and the client checks the
        # cluster's version when it is built.
        from ray.job_submission import JobSubmissionClient  # noqa: PLC0415

        if self._client is None:
            self._client = JobSubmissionClient(self._address)
        return self._client

    async def _ask(self, call: Callable[[], T]) -> T:
        """`call` in a worker thread; a head that does not answer is `RayHeadUnavailableError`,
        and the next call connects afresh (a head back without its state is a new cluster)."""
        try:
            return await asyncio.to_thread(call)
        except Exception as error:
            if head_unavailable(error):
                self._client = None
                raise RayHeadUnavailableError(str(error)) from error
            raise

    async def submit(self, plan: SubmissionPlan, working_dir: Path | None) -> None:
        runtime_env: dict[str, Any] = {"env_vars": plan.env_vars}
        if working_dir is not None:
            runtime_env["working_dir"] = str(working_dir)
        if plan.pip:
            runtime_env["pip"] = list(plan.pip)

        def submit() -> None:
            client = self._connect()
            try:
                client.submit_job(
                    entrypoint=plan.entrypoint,
                    submission_id=plan.submission_id,
                    runtime_env=runtime_env,
                    metadata=plan.metadata,
                    entrypoint_num_cpus=plan.entrypoint_num_cpus,
                    entrypoint_num_gpus=plan.entrypoint_num_gpus,
                    entrypoint_memory=plan.entrypoint_memory_bytes or None,
                    entrypoint_resources=plan.entrypoint_resources or None,
                    entrypoint_label_selector=plan.entrypoint_label_selector or None,
                )
            except RuntimeError as error:
                if "already exists" not in str(error):
                    raise

        await self._ask(submit)

    async def status(self, submission_id: str) -> RayJobStatus | None:
        def status() -> RayJobStatus | None:
            client = self._connect()
            try:
                info = client.get_job_info(submission_id)
            except RuntimeError as error:
                if "404" in str(error) or "does not exist" in str(error):
                    return None
                raise
            node, pool = self._node_of(info.driver_node_id)
            return RayJobStatus(
                state=RayJobState(str(info.status.value)),
                message=info.message,
                error_type=str(info.error_type) if info.error_type else None,
                exit_code=info.driver_exit_code,
                node=node,
                pool=pool,
            )

        return await self._ask(status)

    async def worker_nodes(self, submission_id: str) -> tuple[str, ...] | None:
        def worker_nodes() -> tuple[str, ...] | None:
            from ray.util.state import list_actors  # noqa: PLC0415  # see _connect

            try:
                ray_job = self._connect().get_job_info(submission_id).job_id
                if not ray_job:
                    return None  # its driver has not started
                workers = list_actors(
                    address=self._address,
                    filters=[
                        ("job_id", "=", ray_job),
                        ("class_name", "=", TRAIN_WORKER_CLASS),
                        ("state", "=", "ALIVE"),
                    ],
                    timeout=5,
                    raise_on_missing_output=False,  # see live_nodes
                )
            except Exception:  # noqa: BLE001  # the state API is best effort; ask next time
                return None
            names = [self._node_of(worker.node_id)[0] for worker in workers]
            if None in names:
                return None  # a node without its platform name: say nothing rather than half
            return tuple(sorted(name for name in names if name is not None))

        return await asyncio.to_thread(worker_nodes)

    async def waits_for_room(self, submission_id: str) -> bool | None:
        def waits_for_room() -> bool | None:
            from ray.util.state import list_placement_groups  # noqa: PLC0415  # see _connect

            try:
                ray_job = self._connect().get_job_info(submission_id).job_id
                if not ray_job:
                    return None
                groups = list_placement_groups(
                    address=self._address,
                    filters=[("creator_job_id", "=", ray_job)],
                    timeout=5,
                    raise_on_missing_output=False,  # see live_nodes
                )
            except Exception:  # noqa: BLE001  # the state API is best effort
                return None
            return any(group.state in ("PENDING", "RESCHEDULING") for group in groups)

        return await asyncio.to_thread(waits_for_room)

    async def logs(self, submission_id: str) -> str | None:
        def logs() -> str | None:
            try:
                return str(self._connect().get_job_logs(submission_id))
            except RuntimeError as error:
                if "404" in str(error) or "does not exist" in str(error):
                    return None
                raise

        return await self._ask(logs)

    async def live_nodes(self) -> frozenset[str] | None:
        def live_nodes() -> frozenset[str] | None:
            from ray.util.state import list_nodes  # noqa: PLC0415  # see _connect

            try:
                nodes = list_nodes(
                    address=self._address,
                    filters=[("state", "=", "ALIVE")],
                    timeout=5,
                    limit=10_000,
                    # A head back with its state still lists the head that went, which the
                    # filter leaves out; Ray then takes the answer for truncated and raises.
                    raise_on_missing_output=False,
                )
            except Exception:  # noqa: BLE001  # the state API is best effort
                return None
            return frozenset(
                name for node in nodes if (name := (node.labels or {}).get(NODE_LABEL))
            )

        return await asyncio.to_thread(live_nodes)

    async def lost_worker_nodes(self, submission_id: str) -> tuple[str, ...] | None:
        def lost_worker_nodes() -> tuple[str, ...] | None:
            from ray.util.state import get_node, list_actors  # noqa: PLC0415  # see _connect

            try:
                ray_job = self._connect().get_job_info(submission_id).job_id
                if not ray_job:
                    return ()
                workers = list_actors(
                    address=self._address,
                    filters=[("job_id", "=", ray_job), ("class_name", "=", TRAIN_WORKER_CLASS)],
                    timeout=5,
                    limit=10_000,
                    raise_on_missing_output=False,  # see live_nodes
                )
                lost: set[str] = set()
                for node_id in {worker.node_id for worker in workers if worker.node_id}:
                    node = get_node(node_id, address=self._address, timeout=5)
                    if node is not None and node.state == "DEAD":
                        lost.add(self._node_of(node_id)[0] or node_id)
            except Exception:  # noqa: BLE001  # the state API is best effort
                return None
            return tuple(sorted(lost))

        return await asyncio.to_thread(lost_worker_nodes)

    def _node_of(self, node_id: str | None) -> tuple[str | None, str | None]:
        """The `spotrain-node` and `spotrain-pool` labels the provider gave the node."""
        if not node_id:
            return None, None
        if node_id not in self._node_names:
            from ray.util.state import get_node  # noqa: PLC0415  # see _connect

            try:
                state = get_node(node_id, address=self._address, timeout=5)
            except Exception:  # noqa: BLE001  # the state API is best effort; ask next time
                return None, None
            labels = state.labels if state is not None else {}
            self._node_names[node_id] = (labels.get(NODE_LABEL), labels.get(POOL_LABEL))
        return self._node_names[node_id]

    async def stop(self, submission_id: str) -> None:
        def stop() -> None:
            client = self._connect()
            try:
                client.stop_job(submission_id)
            except RuntimeError as error:
                if "404" not in str(error) and "does not exist" not in str(error):
                    raise

        await self._ask(stop)
