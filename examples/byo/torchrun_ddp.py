"""PyTorch's DDP tutorial script for `torchrun` ("Fault-tolerant Distributed Training with
torchrun"), as its tutorial writes it: a Trainer that saves a snapshot every few epochs and
resumes from it when it starts. Synthetic data; gloo, so it runs on CPUs.

One line differs from the tutorial: the snapshot goes to SPOTRAIN_CHECKPOINT_DIR (the
tutorial writes "snapshot.pt" in the working folder, which goes with a preempted node).
It falls back to the working folder, so the script still runs anywhere:

    spotrain submit torchrun --workdir examples/byo --cpus 2 --spot \\
        -- --standalone --nproc_per_node=2 torchrun_ddp.py 50 5
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class SyntheticDataset(Dataset):
    def __init__(self, size):
        generator = torch.Generator().manual_seed(0)
        self.data = [
            (torch.rand(20, generator=generator), torch.rand(1, generator=generator))
            for _ in range(size)
        ]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path, epoch_delay_s):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.model = model
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        self.epoch_delay_s = epoch_delay_s
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        self.model = DDP(self.model)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}", flush=True)

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            loss = self._run_batch(source, targets)
        time.sleep(self.epoch_delay_s)
        return loss

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch}
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            loss = self._run_epoch(epoch)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)
        if self.global_rank == 0:
            print(
                f"Trained from epoch {self.epochs_run} to {max_epochs}, loss {loss:.4f}", flush=True
            )


def main(save_every, total_epochs, batch_size, epoch_delay_s):
    init_process_group(backend="gloo")
    dataset = SyntheticDataset(256)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    train_data = DataLoader(
        dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset)
    )
    # The one changed line: the tutorial's snapshot_path is "snapshot.pt".
    snapshot_path = os.path.join(os.environ.get("SPOTRAIN_CHECKPOINT_DIR", "."), "snapshot.pt")
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path, epoch_delay_s)
    trainer.train(total_epochs)
    destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument(
        "--batch_size", default=32, type=int, help="Input batch size on each device"
    )
    parser.add_argument("--epoch_delay_s", default=0.2, type=float, help="stands for real work")
    args = parser.parse_args()
    main(args.save_every, args.total_epochs, args.batch_size, args.epoch_delay_s)
