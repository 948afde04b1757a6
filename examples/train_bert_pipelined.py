"""A small BERT (Hugging Face ``transformers``, built from a config: random
weights, nothing downloaded) trained for sequence classification pipelined
over 4 IPUs, the way PopTorch's BERT examples split a model: ``BeginBlock``
puts the embeddings and encoder layer 0 on IPU 0, one encoder layer on each
following IPU, and the classifier with the last layer on IPU 3. The data are
synthetic (random token ids and labels). At the end it prints the loss and
the memory each IPU holds (``torch.ipu.memory_allocated(i)``)."""
from __future__ import annotations

import argparse

import torch
from torch import nn
from tqdm import tqdm
from transformers import BertConfig, BertForSequenceClassification

import poptorch

NUM_IPUS = 4
VOCAB = 1000
NUM_LABELS = 2


class SyntheticClassification(torch.utils.data.Dataset):
    """Random token ids, attention masks with padding, and labels."""

    def __init__(self, size: int, seq_len: int):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, VOCAB, (size, seq_len), generator=g)
        lengths = torch.randint(seq_len // 2, seq_len + 1, (size, 1), generator=g)
        self.mask = (torch.arange(seq_len) < lengths).long()
        self.ids *= self.mask  # token 0 is BERT's padding
        self.labels = torch.randint(0, NUM_LABELS, (size,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.ids[i], self.mask[i], self.labels[i]


class BertWithLoss(nn.Module):
    """Hugging Face's model takes keyword arguments and returns an output object;
    the wrapped model takes tensors and returns the loss (reduced: PopTorch's
    training models return it) and the logits."""

    def __init__(self, bert: BertForSequenceClassification):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask, labels):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        return out.loss, out.logits


def build_model(hidden: int, heads: int, seq_len: int) -> BertWithLoss:
    config = BertConfig(vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=NUM_IPUS,
                        num_attention_heads=heads, intermediate_size=4 * hidden,
                        max_position_embeddings=seq_len, num_labels=NUM_LABELS)
    bert = BertForSequenceClassification(config)
    # Layers before the first block (the embeddings) are on IPU 0 with layer 0;
    # the pooler and classifier follow the last layer onto the last IPU.
    layers = bert.bert.encoder.layer
    for i in range(NUM_IPUS):
        layers[i] = poptorch.BeginBlock(layers[i], user_id=f"layer{i}", ipu_id=i)
    return BertWithLoss(bert)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4, help="training steps (host calls)")
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()

    torch.manual_seed(0)
    opts = poptorch.Options().randomSeed(0)
    opts.setExecutionStrategy(poptorch.PipelinedExecution())
    # A pipeline of N stages needs at least 2N - 1 micro-batches in flight to fill,
    # run and drain: gradients are accumulated over them before each update.
    opts.Training.gradientAccumulation(2 * NUM_IPUS - 1)

    model = build_model(args.hidden, args.heads, args.seq_len)
    model.train()
    optimizer = poptorch.optim.AdamW(model.parameters(), lr=1e-3)
    training_model = poptorch.trainingModel(model, options=opts, optimizer=optimizer)

    samples = args.steps * args.micro_batch_size * opts.Training.gradient_accumulation
    dataset = SyntheticClassification(samples, args.seq_len)
    loader = poptorch.DataLoader(opts, dataset, batch_size=args.micro_batch_size,
                                 shuffle=True, drop_last=True)

    bar = tqdm(loader, desc="Training")
    loss = float("nan")
    for ids, mask, labels in bar:
        loss_tensor, _ = training_model(ids, mask, labels)
        loss = float(loss_tensor.mean())
        bar.set_postfix({"Loss": f"{loss:.3f}"})

    print(f"Final loss: {loss:.4f}")
    for i in range(NUM_IPUS):
        print(f"IPU {i} memory: {torch.ipu.memory_allocated(i) / 2**20:.2f} MiB "
              f"({torch.ipu.memory_allocated(i)} bytes)")
    training_model.detachFromDevice()


if __name__ == "__main__":
    main()
