"""A Ray Train script as Ray's documentation writes one ("Saving and Loading
Checkpoints", Ray 2.60): PyTorch DDP through TorchTrainer, a checkpoint every epoch, and a
restore from `ray.train.get_checkpoint()`. Nothing in it knows of spotrain: no import, no
path, no platform variable. Synthetic data; `--epoch-delay-s` stands for real work.

    spotrain submit examples/byo/ray_train_as_documented.py --workers 2 -- --epochs 30

spotrain supplies where the run keeps its checkpoints and its name, and the capacity its
workers go on; after a spot loss the run goes on from its latest epoch.
"""

import argparse
import os
import tempfile
import time

import numpy as np
import ray.train
import ray.train.torch
import torch
from ray.train import Checkpoint, ScalingConfig
from ray.train.torch import TorchTrainer
from torch import nn


def train_func(config):
    rng = np.random.default_rng(0)
    features = torch.tensor(rng.normal(size=(256, 8)), dtype=torch.float32)
    targets = features @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.5

    model = ray.train.torch.prepare_model(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()

    start_epoch = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            model.module.load_state_dict(torch.load(os.path.join(checkpoint_dir, "model.pt")))
            optimizer.load_state_dict(torch.load(os.path.join(checkpoint_dir, "optimizer.pt")))
            start_epoch = torch.load(os.path.join(checkpoint_dir, "extra_state.pt"))["epoch"] + 1

    rank = ray.train.get_context().get_world_rank()
    world = ray.train.get_context().get_world_size()
    for epoch in range(start_epoch, config["epochs"]):
        shard = slice(rank, None, world)
        loss = loss_fn(model(features[shard]), targets[shard])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(config["epoch_delay_s"])

        metrics = {"loss": loss.item(), "epoch": epoch, "start_epoch": start_epoch}
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            checkpoint = None
            if rank == 0:
                torch.save(model.module.state_dict(), os.path.join(temp_checkpoint_dir, "model.pt"))
                torch.save(
                    optimizer.state_dict(), os.path.join(temp_checkpoint_dir, "optimizer.pt")
                )
                torch.save({"epoch": epoch}, os.path.join(temp_checkpoint_dir, "extra_state.pt"))
                checkpoint = Checkpoint.from_directory(temp_checkpoint_dir)
            ray.train.report(metrics, checkpoint=checkpoint)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--epoch-delay-s", type=float, default=0.5)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    trainer = TorchTrainer(
        train_func,
        train_loop_config={"epochs": args.epochs, "epoch_delay_s": args.epoch_delay_s},
        scaling_config=ScalingConfig(num_workers=args.workers),
    )
    result = trainer.fit()
    print(f"started at epoch {result.metrics['start_epoch']}, ended at {result.metrics['epoch']}")
    print(f"final loss {result.metrics['loss']:.4f}")
