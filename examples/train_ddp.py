"""Multi-node training that bends instead of breaking: PyTorch DDP through Ray Train's
TorchTrainer, a real allreduce of the gradients (gloo on CPUs, NCCL on GPUs), elastic
between the platform's `--workers MIN..MAX`.

A small MLP learns scikit-learn's digits. Every step draws one global batch from (seed,
step) alone, and each of the W workers takes its W-th of it: DDP averages their gradients,
so a step is the same step whatever W is, and a run that lost or gained workers ends
where an uninterrupted one does, up to float rounding.

When a node is about to go (the platform drains it in Ray with its preemption notice),
Ray Train tells every worker (`ray.train.get_preemption_info`): they save a checkpoint at
once, and when the node goes Ray Train restarts the group on the workers it can still
hold, from that checkpoint, inside the same Ray job. A node lost without notice restarts
from the latest periodic checkpoint (`FailureConfig(max_failures)`). Ray Train grows the
group back toward MAX when capacity returns.

Run by hand: `SPOTRAIN_CHECKPOINT_URI=file:///tmp/ddp python examples/train_ddp.py
--local-cpus 3` (with `SPOTRAIN_NUM_WORKERS=2 SPOTRAIN_MAX_WORKERS=3` for a range).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
import ray.train
import ray.train.torch
import torch
from sklearn.datasets import load_digits  # type: ignore[import-untyped]
from torch import nn

from shared.training import TrainingContext, TrainingEnvironment, ray_train_scaling

RUN_NAME = "ddp"  # Ray Train's folder under SPOTRAIN_CHECKPOINT_URI
CLASSES = 10
HIDDEN = 64
NOTICE_SLACK_S = 30.0
"""How long past a notice's deadline a worker waits for Ray Train to restart the group."""


@dataclass(frozen=True)
class Config:
    """What the driver hands every worker, through train_loop_config."""

    seed: int
    steps: int
    checkpoint_every: int
    report_every: int
    lr: float
    batch_size: int
    step_delay_s: float
    local_cpus: int | None
    environment: TrainingEnvironment


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--report-every", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument(
        "--batch-size", type=int, default=120, help="the global batch; divisible by 2, 3, 4"
    )
    parser.add_argument("--step-delay-s", type=float, default=0.0, help="sleep after each step")
    parser.add_argument("--local-cpus", type=int, help="start a private local Ray of N CPUs")
    return parser.parse_args(argv)


def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The training and test sets, split the same way on every worker."""
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.tensor(np.random.default_rng([0, 0]).permutation(len(x)))
    train, test = order[: len(x) * 4 // 5], order[len(x) * 4 // 5 :]
    return x[train], y[train], x[test], y[test]


def new_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def batch_of(config: Config, step: int, rank: int, world: int, size: int) -> torch.Tensor:
    """This rank's share of the step's global batch: a function of (seed, step) alone."""
    batch = np.random.default_rng([config.seed, step]).integers(0, size, config.batch_size)
    return torch.tensor(batch[rank::world])


def save(folder: str, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    torch.save(
        {"step": step, "model": inner.state_dict(), "optimizer": optimizer.state_dict()},
        Path(folder, "state.pt"),
    )


def resume(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load Ray Train's latest checkpoint, if the run has one; the step it is at."""
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as folder:
        state = torch.load(Path(folder, "state.pt"), weights_only=True, map_location="cpu")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def train_loop(loop_config: dict[str, Any]) -> None:
    """What each Ray Train worker runs."""
    config: Config = loop_config["config"]
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    # The worker's GPU when it has one (DDP's allreduce is then NCCL's), else the CPU (gloo).
    device = ray.train.torch.get_device()
    x, y, x_test, y_test = (t.to(device) for t in load_data())
    model = new_model(config.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    start = resume(model, optimizer)
    model = ray.train.torch.prepare_model(model)  # DDP: the gradients' allreduce
    progress = TrainingContext(config.environment) if rank == 0 else None  # `spotrain watch`
    print(f"rank {rank} of {world} on {device}: starting at step {start}", flush=True)
    if progress is not None:
        # The group's size at once, and where it starts: a resize shows where it went on.
        progress.report(start, {}, total_steps=config.steps, workers=world)
        progress.flush_progress()
    loss_fn = nn.CrossEntropyLoss()
    for step in range(start + 1, config.steps + 1):
        batch = batch_of(config, step, rank, world, len(x)).to(device)
        optimizer.zero_grad()
        loss_fn(model(x[batch]), y[batch]).backward()
        optimizer.step()
        time.sleep(config.step_delay_s)
        # A barrier on every worker, the same count each: they agree on one answer.
        notice = ray.train.get_preemption_info()
        last = step == config.steps
        due = last or step % config.checkpoint_every == 0 or notice is not None
        if not (due or step % config.report_every == 0):
            continue
        with torch.no_grad():
            test_loss = float(loss_fn(model(x_test), y_test))
        metrics = {"step": step, "start_step": start, "loss": test_loss, "workers": world}
        if progress is not None:
            progress.report(step, {"loss": test_loss}, total_steps=config.steps, workers=world)
        if not due:
            # Progress goes to the platform above. Ray Train is told of checkpoints only: it
            # takes one report per poll, and a checkpoint queued behind others at a notice
            # would not be registered before the group restarts.
            continue
        with tempfile.TemporaryDirectory() as folder:
            saved = None
            if rank == 0:
                save(folder, step, model, optimizer)
                saved = ray.train.Checkpoint.from_directory(folder)
            # Every worker reports, the same number of times; rank 0 brings the files.
            ray.train.report(metrics, checkpoint=saved, checkpoint_dir_name=f"step_{step:06d}")
        if notice is not None and not last:
            if progress is not None:
                progress.flush_progress()
            wait_for_the_restart(notice.deadline_ms)
    if progress is not None:
        progress.close()


def wait_for_the_restart(deadline_ms: int | None) -> None:
    """After the checkpoint a notice asked for: no step more, which would be lost. At the
    node's deadline Ray Train stops this group and starts one without it, from that
    checkpoint. Should nothing come (a notice with no end), training goes on after it."""
    until = (deadline_ms / 1000 if deadline_ms else time.time() + 120) + NOTICE_SLACK_S
    while time.time() < until:
        time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    environment = TrainingEnvironment.from_mapping(os.environ)
    if args.local_cpus is None:
        ray.init()
    else:
        ray.init(address="local", num_cpus=args.local_cpus, dashboard_port=free_port())
    config = Config(**vars(args), environment=environment)
    trainer = ray.train.torch.TorchTrainer(
        train_loop,
        train_loop_config={"config": config},
        # The platform's count or range, on the attempt's capacity; the driver holds nothing.
        scaling_config=ray.train.ScalingConfig(**ray_train_scaling()),
        run_config=ray.train.RunConfig(
            name=RUN_NAME,
            storage_path=environment.checkpoint_uri,
            # A lost node without notice; preemptions with one have a budget of their own.
            failure_config=ray.train.FailureConfig(max_failures=3),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
        ),
    )
    metrics = trainer.fit().metrics or {}  # rank 0's last report
    start = int(metrics["start_step"])
    began = f"resumed from step {start}" if start else "started at step 0"
    print(f"attempt {environment.attempt}: {began}", flush=True)
    print(f"final loss {metrics['loss']:.6f} on {metrics['workers']} workers", flush=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
