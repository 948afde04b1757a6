"""Hugging Face transformers models (built from configs, random weights, no
downloads) under trainingModel and inferenceModel, unchanged, against the CPU."""
import copy

import pytest
import torch

import poptorch

transformers = pytest.importorskip("transformers")

VOCAB, SEQ, BATCH = 64, 12, 4


def bert():
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, num_labels=3)
    return transformers.BertForSequenceClassification(config)


def gpt2():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                     n_positions=SEQ, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def vit():
    config = transformers.ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=64, hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0, num_labels=3)
    return transformers.ViTForImageClassification(config)


class WithLoss(torch.nn.Module):
    """How PopTorch users wrap a Hugging Face model: the inputs in, the loss and
    logits out."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, inputs, labels):
        out = self.model(**inputs, labels=labels)
        return out.loss, out.logits


def batch(name, step, padded=False):
    g = torch.Generator().manual_seed(step)
    if name == "vit":
        return {"pixel_values": torch.randn(BATCH, 3, 16, 16, generator=g)}, torch.randint(
            0, 3, (BATCH,), generator=g)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    if padded:
        mask[1:, -3:] = 0
    labels = ids.clone() if name == "gpt2" else torch.randint(0, 3, (BATCH,), generator=g)
    return {"input_ids": ids, "attention_mask": mask}, labels


MODELS = {"bert": bert, "gpt2": gpt2, "vit": vit}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_matches_the_cpu_and_settles(name):
    torch.manual_seed(0)
    model = WithLoss(MODELS[name]())
    reference = copy.deepcopy(model)
    ipu = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=0.05))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    # Padding in some batches takes Hugging Face's other attention-mask path.
    schedule = [False, True, False, True, False] if name != "vit" else [False] * 4
    for step, padded in enumerate(schedule):
        inputs, labels = batch(name, step, padded)
        loss, _ = ipu(inputs, labels)
        optimizer.zero_grad()
        ref_loss, _ = reference(inputs, labels)
        ref_loss.backward()
        optimizer.step()
        torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-4, atol=1e-5)
        if step == len(schedule) - 2:
            compiled = poptorch.metrics()["graphs_compiled"]
    # Every path was seen before the last step: it compiled nothing.
    assert poptorch.metrics()["graphs_compiled"] == compiled, "a steady step recompiled"
    for (n, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=n)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_inference_matches_the_cpu(name):
    torch.manual_seed(0)
    model = WithLoss(MODELS[name]()).eval()
    ipu = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))
    for step, padded in enumerate([False, True, False]):
        if step == 2:
            compiled = poptorch.metrics()["graphs_compiled"]
        inputs, labels = batch(name, step, padded and name != "vit")
        inputs = {k: torch.cat([v, v.flip(0)]) for k, v in inputs.items()}
        labels = torch.cat([labels, labels.flip(0)])
        loss, logits = ipu(inputs, labels)
        with torch.no_grad():
            halves = [model({k: v[:BATCH] for k, v in inputs.items()}, labels[:BATCH]),
                      model({k: v[BATCH:] for k, v in inputs.items()}, labels[BATCH:])]
        torch.testing.assert_close(loss, torch.stack([h[0] for h in halves]),
                                   rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(logits, torch.cat([h[1] for h in halves]),
                                   rtol=1e-4, atol=1e-5)
    # The last call's path was seen before: it compiled nothing.
    assert poptorch.metrics()["graphs_compiled"] == compiled, "a steady call recompiled"


@pytest.mark.slow
def test_a_model_wrapped_as_it_is_takes_positional_inputs():
    # As PopTorch's own BERT tests call BertModel: the model itself, its inputs by
    # position. transformers' decorators add `use_cache` as a keyword unless
    # the call gave it by position: forward must see the caller's call, not
    # every default filled in by position ("got multiple values").
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=SEQ)
    model = transformers.BertModel(config).eval()
    inputs, _ = batch("bert", 0, padded=True)
    ids, mask = inputs["input_ids"][:2], inputs["attention_mask"][:2]
    with torch.no_grad():
        expected = model(ids, mask)
    model.embeddings.position_embeddings = poptorch.BeginBlock(
        model.embeddings.position_embeddings, ipu_id=1)
    out = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))(ids, mask)
    for key in ("last_hidden_state", "pooler_output"):
        torch.testing.assert_close(out[key], expected[key], rtol=1e-4, atol=1e-5)
