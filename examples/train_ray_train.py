"""A real training script that checkpoints with Ray Train's own mechanism instead of the helper:
numpy logistic regression on scikit-learn's digits, run by a Ray Train v2 DataParallelTrainer.

Resuming: Ray Train keeps a run snapshot under RunConfig(storage_path, name). A later attempt (a
new driver given the same two) finds it and hands the latest reported checkpoint to
`ray.train.get_checkpoint()`; within one attempt FailureConfig(max_failures) restarts a failed
worker group from it. SPOTRAIN_RESUME_FROM names a helper-format checkpoint and is not used.

Simplification: without torch there is no allreduce, so each worker runs SGD on its own shard
and only rank 0's weights are checkpointed and evaluated; after a restart every worker starts
from rank 0's weights. With one worker it is plain SGD, and a resumed run ends with exactly the
weights of an uninterrupted one: each step's minibatch is drawn from (seed, rank, step) alone.

As a Ray job's entrypoint, `ray.init()` attaches to the job's cluster; `--local-cpus N` starts a
private local cluster of N CPUs instead, for tests and laptops.
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
import numpy.typing as npt
import ray
import ray.train
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
from sklearn.datasets import load_digits  # type: ignore[import-untyped]

from shared.training import TrainingContext, TrainingEnvironment, ray_train_scaling

RUN_NAME = "ray-train"  # Ray Train's folder under SPOTRAIN_CHECKPOINT_URI
CLASSES = 10

Floats = npt.NDArray[np.float64]
Labels = npt.NDArray[np.int64]


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
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--report-every", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--step-delay-s", type=float, default=0.0, help="sleep after each step")
    parser.add_argument("--local-cpus", type=int, help="start a private local Ray of N CPUs")
    return parser.parse_args(argv)


def load_data(seed: int, rank: int, world_size: int) -> tuple[Floats, Labels, Floats, Labels]:
    """This rank's shard of the training set, and the whole test set."""
    digits = load_digits()
    x = np.asarray(digits.data, dtype=np.float64) / 16.0
    y = np.asarray(digits.target, dtype=np.int64)
    order = np.random.default_rng([seed, 0]).permutation(len(x))
    train, test = order[: len(x) * 4 // 5], order[len(x) * 4 // 5 :]
    return x[train][rank::world_size], y[train][rank::world_size], x[test], y[test]


def initial_model(seed: int, features: int) -> tuple[Floats, Floats]:
    weights = np.random.default_rng([seed, 1]).normal(0.0, 0.01, size=(features, CLASSES))
    return weights, np.zeros(CLASSES)


def probabilities(weights: Floats, bias: Floats, x: Floats) -> Floats:
    logits = x @ weights + bias
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return np.asarray(exp / exp.sum(axis=1, keepdims=True), dtype=np.float64)


def sgd_step(
    weights: Floats, bias: Floats, x: Floats, y: Labels, c: Config, *, key: list[int]
) -> None:
    """One minibatch step, in place; `key` (seed, rank, step) alone picks the batch."""
    batch = np.random.default_rng(key).integers(0, len(x), size=c.batch_size)
    grad = probabilities(weights, bias, x[batch])
    grad[np.arange(c.batch_size), y[batch]] -= 1.0
    weights -= c.lr * (x[batch].T @ grad) / c.batch_size
    bias -= c.lr * grad.mean(axis=0)


def train_loop(loop_config: dict[str, Any]) -> None:
    """What each Ray Train worker runs: resume, train, report, checkpoint every N steps."""
    config: Config = loop_config["config"]
    context = ray.train.get_context()
    rank = context.get_world_rank()
    x, y, x_test, y_test = load_data(config.seed, rank, context.get_world_size())
    progress = TrainingContext(config.environment) if rank == 0 else None  # for `spotrain watch`
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        start, (weights, bias) = 0, initial_model(config.seed, x.shape[1])
    else:
        with checkpoint.as_directory() as folder:
            start = int(Path(folder, "step.txt").read_text())
            weights, bias = np.load(Path(folder, "weights.npy")), np.load(Path(folder, "bias.npy"))
    print(f"rank {rank}: starting at step {start}", flush=True)
    for step in range(start + 1, config.steps + 1):
        sgd_step(weights, bias, x, y, config, key=[config.seed, rank, step])
        time.sleep(config.step_delay_s)
        last = step == config.steps
        if not (last or step % config.report_every == 0 or step % config.checkpoint_every == 0):
            continue
        accuracy = float((probabilities(weights, bias, x_test).argmax(axis=1) == y_test).mean())
        if progress is not None:
            progress.report(step, {"accuracy": accuracy}, total_steps=config.steps)
        if last or step % config.checkpoint_every == 0:
            with tempfile.TemporaryDirectory() as folder:
                saved = None
                if rank == 0:
                    np.save(Path(folder, "weights.npy"), weights)
                    np.save(Path(folder, "bias.npy"), bias)
                    Path(folder, "step.txt").write_text(str(step))
                    saved = ray.train.Checkpoint.from_directory(folder)
                # Every worker must call report, the same number of times; rank 0 brings the files.
                metrics = {"step": step, "start_step": start, "accuracy": accuracy}
                ray.train.report(metrics, checkpoint=saved, checkpoint_dir_name=f"step_{step:06d}")
    if progress is not None:
        progress.close()  # the last report, which may wait out the storage's write rate


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
        # A free dashboard port, so a private cluster never takes 8265 from a real one.
        ray.init(address="local", num_cpus=args.local_cpus, dashboard_port=free_port())
    config = Config(**vars(args), environment=environment)
    trainer = DataParallelTrainer(
        train_loop,
        train_loop_config={"config": config},
        # The platform's count or elastic range (--workers 2..4), on the attempt's capacity.
        scaling_config=ray.train.ScalingConfig(**ray_train_scaling()),
        run_config=ray.train.RunConfig(
            name=RUN_NAME,
            storage_path=environment.checkpoint_uri,  # file:///… or gs://…, as pyarrow reads it
            failure_config=ray.train.FailureConfig(max_failures=3),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
        ),
    )
    metrics = trainer.fit().metrics or {}  # rank 0's last report
    start = int(metrics["start_step"])
    began = f"resumed from step {start}" if start else "started at step 0"
    print(f"attempt {environment.attempt}: {began}", flush=True)
    print(f"final accuracy {metrics['accuracy']:.4f}", flush=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
