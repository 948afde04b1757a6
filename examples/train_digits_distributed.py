"""Several processes, PopDist-style: each process runs its replicas of the
digits model (``poptorch.trainingModel``), reads its own share of the data
(``poptorch.DataLoader``), and the gradients of every replica of every process
are reduced before each weight update. Launch it with torchrun:

    torchrun --nproc_per_node 2 examples/train_digits_distributed.py

and across hosts (run on each, with the address of the first):

    torchrun --nnodes 2 --nproc_per_node 2 --rdzv-backend c10d \\
        --rdzv-endpoint HOST0:29400 --rdzv-id digits examples/train_digits_distributed.py

With ``--checkpoint PATH`` process 0 saves the model and optimiser after each
epoch and a restarted job (``torchrun --max-restarts N``) resumes from it."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import poptorch  # noqa: E402
from classification_model import ClassificationModel  # noqa: E402
from digits_data import digits_datasets  # noqa: E402
from train_digits import ModelwithLoss  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=2, help="replicas per process")
    parser.add_argument("--checkpoint", help="save after each epoch, resume from it")
    args = parser.parse_args()

    torch.manual_seed(0)
    train_dataset, test_dataset = digits_datasets()
    # Process id and count come from torchrun's RANK and WORLD_SIZE.
    opts = poptorch.Options().replicationFactor(args.replicas).randomSeed(0)
    process, processes = opts.Distributed.processId, opts.Distributed.numProcesses
    train_loader = poptorch.DataLoader(opts, train_dataset, batch_size=args.batch_size,
                                       shuffle=True)
    model = ModelwithLoss(ClassificationModel(), nn.CrossEntropyLoss())
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    first_epoch = 1
    if args.checkpoint and os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first_epoch = state["epoch"] + 1
        train_loader.sampler.epoch = state["epoch"]  # the shares of the epochs left
    # Process 0's weights are broadcast to the others when the model is compiled.
    training_model = poptorch.trainingModel(model, opts, optimizer)

    for epoch in range(first_epoch, args.epochs + 1):
        total = torch.zeros(2)
        for data, labels in train_loader:
            _, loss = training_model(data, labels)
            total += torch.tensor([float(loss.mean()), 1.0])  # one loss per replica
        total = summed_over_processes(total)  # the mean loss over every process's batches
        if process == 0:
            print(f"epoch {epoch}: mean loss {total[0] / total[1]:.4f}", flush=True)
            if args.checkpoint:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch}, args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)
    training_model.detachFromDevice()

    eval_opts = poptorch.Options().replicationFactor(args.replicas)
    test_loader = poptorch.DataLoader(eval_opts, test_dataset, batch_size=args.batch_size)
    inference_model = poptorch.inferenceModel(model.eval(), eval_opts)
    counts = torch.zeros(2)
    for data, labels in test_loader:
        predictions = inference_model(data).argmax(dim=1)
        counts += torch.tensor([float((predictions == labels).sum()), float(len(labels))])
    counts = summed_over_processes(counts)
    if process == 0:
        print(f"Eval accuracy over {processes} processes: {100 * counts[0] / counts[1]:.2f}%")
    if dist.is_initialized():
        dist.destroy_process_group()


def summed_over_processes(values: torch.Tensor) -> torch.Tensor:
    """``values`` summed over the processes (the trainingModel joined them)."""
    if dist.is_initialized():
        dist.all_reduce(values)
    return values


if __name__ == "__main__":
    main()
