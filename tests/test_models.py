"""Model contracts, checked over the architecture registry: shapes, masks, caches, attention."""

import pytest
import torch

from zoo.models import ARCHITECTURES, build_model, task_of
from zoo.models.transformer import SelfAttention, TransformerConfig

VOCAB = 23
LM_ARCHS = sorted(name for name, (family, _) in ARCHITECTURES.items() if task_of(family) == "causal_lm")
TRANSLATION_ARCHS = sorted(name for name, (family, _) in ARCHITECTURES.items() if task_of(family) == "translation")
TINY_ARCHS = sorted(name for name in ARCHITECTURES if name.endswith("_tiny"))
RECURRENT_TINY = sorted(name for name in TINY_ARCHS if ARCHITECTURES[name][0] in ("rnn_lm", "gru_lm"))
CAUSAL_TINY = sorted(name for name in TINY_ARCHS if task_of(ARCHITECTURES[name][0]) == "causal_lm")


def small(name: str, **overrides) -> torch.nn.Module:
    """`name` built with a small vocabulary and no dropout, in eval mode."""
    family = ARCHITECTURES[name][0]
    vocab = {"src_vocab_size": VOCAB, "tgt_vocab_size": VOCAB + 4} if family == "seq2seq" else {"vocab_size": VOCAB}
    return build_model(name, **vocab, dropout=0.0, **overrides).eval()


def test_registry_has_a_tiny_variant_of_every_family():
    families = {family for family, _ in ARCHITECTURES.values()}
    assert families == {ARCHITECTURES[name][0] for name in TINY_ARCHS}


@pytest.mark.parametrize("name", LM_ARCHS)
def test_language_model_shapes_and_finite(name):
    model = small(name)
    tokens = torch.randint(0, VOCAB, (2, 7))
    logits, state = model(tokens)
    assert logits.shape == (2, 7, VOCAB)
    assert torch.isfinite(logits).all()
    assert state is not None or ARCHITECTURES[name][0] == "transformer"
    model.train()
    logits, _ = model(tokens)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name", TRANSLATION_ARCHS)
def test_translator_shapes_and_finite(name):
    model = small(name)
    src = torch.randint(1, VOCAB, (3, 6))
    src_lengths = torch.tensor([6, 4, 1])
    src[1, 4:] = src[2, 1:] = 0
    tgt_in = torch.randint(1, VOCAB + 4, (3, 5))
    logits, attention = model(src, src_lengths, tgt_in, return_attention=True)
    assert logits.shape == (3, 5, VOCAB + 4)
    assert torch.isfinite(logits).all()
    if model.config.attention:
        assert attention.shape == (3, 5, 6)
    else:
        assert attention is None


@pytest.mark.parametrize("name", CAUSAL_TINY)
def test_future_tokens_never_change_earlier_logits(name):
    model = small(name)
    tokens = torch.randint(0, VOCAB, (2, 12))
    changed = tokens.clone()
    changed[:, 7:] = (changed[:, 7:] + 1 + torch.randint(0, VOCAB - 1, (2, 5))) % VOCAB
    with torch.no_grad():
        before, _ = model(tokens)
        after, _ = model(changed)
    torch.testing.assert_close(after[:, :7], before[:, :7], rtol=0, atol=1e-6)
    assert (after[:, 7] - before[:, 7]).abs().max() > 1e-4, "the changed token itself must matter"


def test_self_attention_without_positions_or_mask_is_permutation_equivariant():
    attention = SelfAttention(TransformerConfig(n_embd=16, n_head=2, dropout=0.0, causal=False)).eval()
    x = torch.randn(2, 9, 16)
    perm = torch.randperm(9)
    with torch.no_grad():
        torch.testing.assert_close(attention(x[:, perm]), attention(x)[:, perm], rtol=1e-5, atol=1e-6)
    causal = SelfAttention(TransformerConfig(n_embd=16, n_head=2, dropout=0.0, causal=True)).eval()
    causal.load_state_dict(attention.state_dict())
    with torch.no_grad():
        assert (causal(x[:, perm]) - causal(x)[:, perm]).abs().max() > 1e-3, "a causal mask breaks the symmetry"


@pytest.mark.parametrize("positions", ["none", "learned", "sinusoidal"])
def test_transformer_is_permutation_equivariant_only_without_positions(positions):
    model = small("transformer_tiny", positions=positions, causal=False)
    if positions == "learned":  # the default init (std 0.02) is small; make the positions count
        torch.nn.init.normal_(model.position_embedding.weight, std=1.0)
    tokens = torch.randperm(VOCAB)[:10].unsqueeze(0)
    perm = torch.randperm(10)
    with torch.no_grad():
        logits, _ = model(tokens)
        permuted, _ = model(tokens[:, perm])
    gap = (permuted - logits[:, perm]).abs().max().item()
    if positions == "none":
        assert gap < 1e-5
    else:
        assert gap > 1e-3, f"{positions} positions should make the output depend on order"


@pytest.mark.parametrize("name", sorted(n for n in TRANSLATION_ARCHS if ARCHITECTURES[n][1].attention))
def test_bahdanau_weights_sum_to_one_and_are_zero_on_padding(name):
    model = small(name)
    src_lengths = torch.tensor([5, 3, 1, 2])
    src = torch.randint(1, VOCAB, (4, 5))
    src = src.masked_fill(torch.arange(5) >= src_lengths.unsqueeze(1), 0)
    tgt_in = torch.randint(1, VOCAB + 4, (4, 6))
    with torch.no_grad():
        _, attention = model(src, src_lengths, tgt_in, return_attention=True)  # (B, T, S)
    torch.testing.assert_close(attention.sum(-1), torch.ones(4, 6))
    padding = (torch.arange(5) >= src_lengths.unsqueeze(1)).unsqueeze(1).expand_as(attention)
    assert (attention[padding] == 0).all()
    assert (attention[~padding] > 0).all()


@pytest.mark.parametrize("name", TRANSLATION_ARCHS)
def test_translation_of_a_row_does_not_depend_on_batch_padding(name):
    model = small(name)
    short = torch.randint(1, VOCAB, (1, 3))
    batch = torch.cat([short, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    batch = torch.cat([batch, torch.randint(1, VOCAB, (1, 7))])
    tgt_in = torch.randint(1, VOCAB + 4, (2, 4))
    with torch.no_grad():
        alone = model(short, torch.tensor([3]), tgt_in[:1])
        padded = model(batch, torch.tensor([3, 7]), tgt_in)
    torch.testing.assert_close(padded[:1], alone, rtol=1e-5, atol=1e-5)


def test_transformer_cached_logits_match_uncached_token_by_token():
    model = small("transformer_tiny")
    tokens = torch.randint(0, VOCAB, (3, 20))
    with torch.no_grad():
        full, none_state = model(tokens)
        assert none_state is None
        state = model.init_state(3)
        steps = []
        for t in range(20):
            logits, state = model(tokens[:, t : t + 1], state)
            steps.append(logits)
        assert state.length == 20
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "none"])
def test_transformer_prefill_then_steps_match_uncached(positions):
    model = small("transformer_tiny", positions=positions)
    tokens = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():
        full, _ = model(tokens)
        prefill, state = model(tokens[:, :9], model.init_state(2, max_len=16))
        steps = [model(tokens[:, t : t + 1], state)[0] for t in range(9, 16)]
    torch.testing.assert_close(prefill, full[:, :9], rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.cat(steps, dim=1), full[:, 9:], rtol=0, atol=1e-5)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "none"])
def test_transformer_one_token_step_matches_the_general_path(positions, bias):
    """An eval-mode one-token step through the cache takes a leaner path; it computes the same logits
    and cache as the general path (taken in train mode, here without dropout)."""
    model = small("transformer_tiny", positions=positions, bias=bias)
    for parameter in model.parameters():  # nonzero biases and layer-norm shifts
        torch.nn.init.normal_(parameter, std=0.3)
    tokens = torch.randint(0, VOCAB, (3, 12))
    pad_mask = torch.ones(3, 8, dtype=torch.bool)
    pad_mask[1, :3] = False  # one left-padded row: the step must mask its padding and count positions
    results = []
    with torch.no_grad():
        for train in (False, True):
            model.train(train)
            state = model.init_state(3)
            model(tokens[:, :8], state, pad_mask)
            steps = [model(tokens[:, t : t + 1], state)[0] for t in range(8, 12)]
            results.append((torch.cat(steps, dim=1), state.keys[:, :, :, :12], state.values[:, :, :, :12]))
    for lean, general in zip(*results):
        torch.testing.assert_close(lean, general, rtol=0, atol=1e-5)


def test_transformer_step_falls_back_to_modules_it_cannot_read():
    """A layer replaced by something other than a plain `nn.Linear` (a quantized or adapted layer) is
    called as a module, so its own forward takes effect in decoding too."""

    class Doubled(torch.nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    model = small("transformer_tiny")
    fc = model.blocks[0].mlp.fc
    model.blocks[0].mlp.fc = Doubled(fc.in_features, fc.out_features, bias=False)
    model.blocks[0].mlp.fc.weight = fc.weight
    tokens = torch.randint(0, VOCAB, (2, 10))
    with torch.no_grad():
        full, _ = model(tokens)
        state = model.init_state(2)
        model(tokens[:, :6], state)
        steps = torch.cat([model(tokens[:, t : t + 1], state)[0] for t in range(6, 10)], dim=1)
    torch.testing.assert_close(steps, full[:, 6:], rtol=0, atol=1e-5)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.long])
def test_transformer_left_padded_batch_matches_each_row_alone(mask_dtype):
    """Left padding (pad_mask False) neither is attended to nor shifts positions, cached or not."""
    model = small("transformer_tiny")
    rows = [torch.randint(0, VOCAB, (n,)) for n in (10, 6, 3)]
    width = max(len(r) for r in rows)
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    pad_mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        tokens[i, width - len(row) :] = row
        pad_mask[i, width - len(row) :] = True
    pad_mask = pad_mask.to(mask_dtype)
    with torch.no_grad():
        alone = [model(row.unsqueeze(0))[0][0] for row in rows]
        batched, _ = model(tokens, None, pad_mask)
        # prefill the padded prompt, then decode 4 more tokens one at a time
        more = torch.randint(0, VOCAB, (len(rows), 4))
        state = model.init_state(len(rows))
        cached = [model(tokens, state, pad_mask)[0]]
        cached += [model(more[:, t : t + 1], state)[0] for t in range(4)]
        cached = torch.cat(cached, dim=1)
        extended = [model(torch.cat([row, more[i]]).unsqueeze(0))[0][0] for i, row in enumerate(rows)]
    for i, row in enumerate(rows):
        torch.testing.assert_close(batched[i, width - len(row) :], alone[i], rtol=0, atol=1e-5)
        torch.testing.assert_close(cached[i, width - len(row) :], extended[i], rtol=0, atol=1e-5)
        assert torch.isfinite(batched[i]).all()


@pytest.mark.parametrize("name", RECURRENT_TINY)
def test_recurrent_stepwise_decoding_matches_full_sequence(name):
    model = small(name, n_layer=2)
    tokens = torch.randint(0, VOCAB, (3, 15))
    with torch.no_grad():
        full, final = model(tokens)
        state = model.init_state(3)
        steps = []
        for t in range(15):
            logits, state = model(tokens[:, t : t + 1], state)
            steps.append(logits)
        chunked_a, mid = model(tokens[:, :8])
        chunked_b, end = model(tokens[:, 8:], mid)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)
    torch.testing.assert_close(state, final, rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.cat([chunked_a, chunked_b], dim=1), full, rtol=0, atol=1e-5)
    torch.testing.assert_close(end, final, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", sorted(n for n in LM_ARCHS if ARCHITECTURES[n][1].tie_weights))
def test_tied_weights_share_one_tensor(name):
    model = small(name)
    embedding = model.token_embedding if hasattr(model, "token_embedding") else model.embedding
    assert model.head.weight is embedding.weight

