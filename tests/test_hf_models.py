"""Hugging Face transformers models (built from configs, random weights, no
downloads) under trainingModel and inferenceModel, unchanged, and trained in lazy
mode, against the CPU; generation on the ipu, and refused through a wrapper."""
import copy

import pytest
import torch

import poptorch

transformers = pytest.importorskip("transformers")

VOCAB, SEQ, BATCH = 64, 12, 4
LR = 0.05


def bert():
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0, num_labels=3)
    return transformers.BertForSequenceClassification(config)


def distilbert():
    config = transformers.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4,
                                           hidden_dim=64, max_position_embeddings=SEQ,
                                           dropout=0.0, attention_dropout=0.0,
                                           seq_classif_dropout=0.0, num_labels=3)
    return transformers.DistilBertForSequenceClassification(config)


def roberta():
    # RoBERTa's positions start after its padding index: two more than the sequence.
    config = transformers.RobertaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=64,
                                        max_position_embeddings=SEQ + 2, hidden_dropout_prob=0.0,
                                        attention_probs_dropout_prob=0.0, num_labels=3)
    return transformers.RobertaForSequenceClassification(config)


def gpt2():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                     n_positions=SEQ, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, bos_token_id=1, eos_token_id=2)
    return transformers.GPT2LMHeadModel(config)


def gpt_neo():
    # One global and one local (windowed) attention layer.
    config = transformers.GPTNeoConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2,
                                       num_heads=4, attention_types=[[["global", "local"], 1]],
                                       window_size=4, max_position_embeddings=SEQ,
                                       embed_dropout=0.0, attention_dropout=0.0,
                                       resid_dropout=0.0, bos_token_id=1, eos_token_id=2)
    return transformers.GPTNeoForCausalLM(config)


# The Llama-style decoders' common size: grouped-query attention (2 key-value
# heads for 4), rotary positions, RMSNorm.
LLAMA_SIZE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)


def llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_SIZE))


def mixtral():
    # A mixture of experts: each token routed to 2 of 4 experts (a histc of the
    # routing, grouped matrix products).
    config = transformers.MixtralConfig(**LLAMA_SIZE, num_local_experts=4, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config)


def t5():
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                   num_heads=4, dropout_rate=0.0, decoder_start_token_id=0,
                                   pad_token_id=0, eos_token_id=2)
    return transformers.T5ForConditionalGeneration(config)


def whisper():
    # 8 mel bins over 16 frames: the encoder's two convolutions halve them to 8 positions.
    config = transformers.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=8, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_source_positions=8, max_target_positions=SEQ, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=1, begin_suppress_tokens=None,
        suppress_tokens=None)
    return transformers.WhisperForConditionalGeneration(config)


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
    if name == "whisper":  # log-mel features in, the transcript's tokens as labels
        return {"input_features": torch.randn(BATCH, 8, 16, generator=g)}, torch.randint(
            3, VOCAB, (BATCH, 6), generator=g)
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=g)  # no special tokens
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    if padded:
        mask[1:, -3:] = 0
    if name in ("gpt2", "gpt_neo", "llama", "mixtral"):  # causal LMs predict their inputs
        labels = ids.clone()
    elif name == "t5":  # the decoder's target sequence
        labels = torch.randint(3, VOCAB, (BATCH, 6), generator=g)
    else:
        labels = torch.randint(0, 3, (BATCH,), generator=g)
    return {"input_ids": ids, "attention_mask": mask}, labels


MODELS = {f.__name__: f for f in (bert, distilbert, roberta, gpt2, gpt_neo, llama, mixtral, t5,
                                  whisper, vit)}
# Models whose attention takes a padding mask: some batches are padded.
PADDED = {"bert", "distilbert", "roberta", "gpt2", "gpt_neo", "llama", "mixtral", "t5"}


def model_and_cpu_copy(name):
    """The model with its loss, a copy of it for the CPU and the copy's SGD."""
    torch.manual_seed(0)
    model = WithLoss(MODELS[name]())
    reference = copy.deepcopy(model)
    return model, reference, torch.optim.SGD(reference.parameters(), lr=LR)


def cpu_step(reference, optimizer, inputs, labels):
    loss, logits = reference(inputs, labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach(), logits.detach()


def assert_same_weights(model, reference):
    for (n, a), (_, b) in zip(model.state_dict().items(), reference.state_dict().items()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5, msg=n)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_matches_the_cpu_and_settles(name):
    model, reference, optimizer = model_and_cpu_copy(name)
    ipu = poptorch.trainingModel(model, None, torch.optim.SGD(model.parameters(), lr=LR))
    # Padding in some batches takes Hugging Face's other attention-mask path.
    schedule = [False, True, False, True, False] if name in PADDED else [False] * 4
    for step, padded in enumerate(schedule):
        inputs, labels = batch(name, step, padded)
        loss, _ = ipu(inputs, labels)
        ref_loss, _ = cpu_step(reference, optimizer, inputs, labels)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-5)
        if step == len(schedule) - 2:
            compiled = poptorch.metrics()["graphs_compiled"]
    # Every path was seen before the last step: it compiled nothing.
    assert poptorch.metrics()["graphs_compiled"] == compiled, "a steady step recompiled"
    assert_same_weights(model, reference)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_inference_matches_the_cpu(name):
    torch.manual_seed(0)
    model = WithLoss(MODELS[name]()).eval()
    ipu = poptorch.inferenceModel(model, poptorch.Options().deviceIterations(2))
    for step, padded in enumerate([False, True, False]):
        if step == 2:
            compiled = poptorch.metrics()["graphs_compiled"]
        inputs, labels = batch(name, step, padded and name in PADDED)
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
@pytest.mark.parametrize("name", sorted(MODELS))
def test_lazy_training_on_the_ipu_matches_the_cpu(name):
    model, reference, ref_optimizer = model_and_cpu_copy(name)
    model.to("ipu")
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for step, padded in enumerate([False, True, False]):
        inputs, labels = batch(name, step, padded and name in PADDED)
        loss, logits = model({k: v.to("ipu") for k, v in inputs.items()}, labels.to("ipu"))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ref_loss, ref_logits = cpu_step(reference, ref_optimizer, inputs, labels)
        torch.testing.assert_close(loss.cpu(), ref_loss, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(logits.cpu(), ref_logits, rtol=1e-4, atol=1e-4)
    assert_same_weights(model, reference)


GENERATORS = ("gpt2", "gpt_neo", "llama", "t5", "whisper")


def prompt(name):
    inputs, _ = batch(name, 0)
    # Room for the new tokens within the decoders' positions.
    return inputs if name == "whisper" else {k: v[:, :6] for k, v in inputs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", GENERATORS)
def test_generate_on_the_ipu_matches_the_cpu(name):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    inputs = prompt(name)
    settings = {"max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        expected = model.generate(**inputs, **settings)
        tokens = model.to("ipu").generate(**{k: v.to("ipu") for k, v in inputs.items()},
                                          **settings)
    assert tokens.device.type == "ipu"
    assert torch.equal(tokens.cpu(), expected)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "t5"])
@pytest.mark.parametrize("wrap", [poptorch.inferenceModel, poptorch.trainingModel])
def test_generate_through_the_wrapper_is_refused(name, wrap):
    # The wrapper runs forward on the IPU only when called itself: generate()
    # through it ran the host model, silently. T5's first module call is its
    # encoder, a submodule.
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    wrapped = wrap(model)
    with pytest.raises(poptorch.Error, match=r"generate\(\), called through the .* runs .* on "
                       r"the host.*model.to\('ipu'\), then model.generate.*wrapped.model.generate"):
        wrapped.generate(**prompt(name), max_new_tokens=2, pad_token_id=0)
    # Methods that run no module are the model's, as in PopTorch.
    assert wrapped.get_input_embeddings() is model.get_input_embeddings()
    assert wrapped.num_parameters() == model.num_parameters()
    assert wrapped.model.generate(**prompt(name), max_new_tokens=2,
                                  pad_token_id=0).shape[1] > 2


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
