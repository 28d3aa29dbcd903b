"""A real training script on the spotrain contract: multinomial logistic regression in numpy on
scikit-learn's bundled digits. It resumes, reports, checkpoints, and stops cleanly on request."""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from sklearn.datasets import load_digits  # type: ignore[import-untyped]

from shared.training import TrainingContext

EXIT_CHECKPOINTED = 143  # 128 + SIGTERM, what a shell reports for a run ended by SIGTERM
CLASSES = 10

Floats = npt.NDArray[np.float64]
Labels = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Data:
    x_train: Floats
    y_train: Labels
    x_test: Floats
    y_test: Labels


@dataclass
class Model:
    weights: Floats
    bias: Floats
    rng: np.random.Generator  # draws the minibatches, so it is part of what a checkpoint holds


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--report-every", type=int, default=10)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--step-delay-s",
        type=float,
        default=0.0,
        help="sleep after each step, as a slower model would, so preemption drills can land",
    )
    return parser.parse_args(argv)


def load_data(seed: int) -> Data:
    digits = load_digits()
    x = np.asarray(digits.data, dtype=np.float64) / 16.0
    y = np.asarray(digits.target, dtype=np.int64)
    order = np.random.default_rng([seed, 0]).permutation(len(x))
    cut = len(x) * 4 // 5
    return Data(x[order[:cut]], y[order[:cut]], x[order[cut:]], y[order[cut:]])


def fresh_model(seed: int, features: int) -> Model:
    rng = np.random.default_rng([seed, 1])
    weights = rng.normal(0.0, 0.01, size=(features, CLASSES))
    return Model(weights=weights, bias=np.zeros(CLASSES), rng=rng)


def probabilities(model: Model, x: Floats) -> Floats:
    logits = x @ model.weights + model.bias
    logits -= logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    return np.asarray(exp / exp.sum(axis=1, keepdims=True), dtype=np.float64)


def train_step(model: Model, data: Data, lr: float, batch_size: int) -> None:
    batch = model.rng.integers(0, len(data.x_train), size=batch_size)
    x, y = data.x_train[batch], data.y_train[batch]
    grad = probabilities(model, x)
    grad[np.arange(batch_size), y] -= 1.0
    model.weights -= lr * (x.T @ grad) / batch_size
    model.bias -= lr * grad.mean(axis=0)


def evaluate(model: Model, data: Data) -> dict[str, float]:
    p_train = probabilities(model, data.x_train)
    loss = -np.log(p_train[np.arange(len(data.y_train)), data.y_train] + 1e-12).mean()
    predicted = probabilities(model, data.x_test).argmax(axis=1)
    return {"loss": float(loss), "accuracy": float((predicted == data.y_test).mean())}


def to_npy(array: Floats) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def from_npy(raw: bytes) -> Floats:
    return np.asarray(np.load(io.BytesIO(raw), allow_pickle=False), dtype=np.float64)


def encode(model: Model) -> dict[str, bytes]:
    return {
        "weights.npy": to_npy(model.weights),
        "bias.npy": to_npy(model.bias),
        "rng.json": json.dumps(model.rng.bit_generator.state).encode(),
    }


def decode(files: dict[str, bytes]) -> Model:
    rng = np.random.default_rng()
    rng.bit_generator.state = json.loads(files["rng.json"])
    return Model(from_npy(files["weights.npy"]), from_npy(files["bias.npy"]), rng)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    data = load_data(args.seed)
    with TrainingContext.from_env() as context:
        resumed = context.resume()
        if resumed is None:
            step, model = 0, fresh_model(args.seed, data.x_train.shape[1])
            print(f"attempt {context.attempt}: starting at step 0", flush=True)
        else:
            step, model = resumed[0], decode(resumed[1])
            print(f"attempt {context.attempt}: resumed from step {step}", flush=True)
        while step < args.steps:
            train_step(model, data, args.lr, args.batch_size)
            step += 1
            if args.step_delay_s > 0:
                time.sleep(args.step_delay_s)
            if step % args.report_every == 0 or step == args.steps:
                context.report(step, evaluate(model, data), total_steps=args.steps)
            if context.checkpoint_requested:
                context.save(step, encode(model))
                print(f"checkpoint requested: saved step {step}, stopping", flush=True)
                return EXIT_CHECKPOINTED
            if step % args.checkpoint_every == 0 or step == args.steps:
                context.save(step, encode(model))
    print(f"final accuracy {evaluate(model, data)['accuracy']:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
