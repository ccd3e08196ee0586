"""Gates for gpt.py: the KV cache changes no token, the init and FLOP count are GPT-2's and PaLM's, checkpointing
changes no gradient, and bad shapes are refused; each option of a modern GPT keeps every one of these promises."""
import math

import pytest
import torch
import torch.nn.functional as F

from train_template import gpt, models


def tiny_gpt(seed: int = 0, **overrides) -> gpt.GPT:
    torch.manual_seed(seed)
    config = dict(vocab_size=256, block_size=64, n_layer=2, n_head=2, n_embd=64)
    config.update(overrides)
    return gpt.GPT(**config)


# Each option of [model.gpt] alone, then a modern GPT's all at once (Llama's parts, Gemma's cap, an untied head).
MODERN = dict(norm="rmsnorm", position="rope", mlp="swiglu", qk_norm=True, logit_softcap=30.0, tie_embeddings=False)
OPTIONS = {"rmsnorm": dict(norm="rmsnorm"), "rope": dict(position="rope"), "nope": dict(position="none"),
           "swiglu": dict(mlp="swiglu"),
           "relu2": dict(mlp="relu2"), "qk_norm": dict(qk_norm=True), "softcap": dict(logit_softcap=30.0),
           "untied": dict(tie_embeddings=False), "post-norm": dict(norm_placement="post"), "modern": MODERN}


def prompt(length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("prompt_len", [10, 40])
def test_greedy_generation_is_identical_with_and_without_the_cache(prompt_len):
    model = tiny_gpt()
    idx = prompt(prompt_len)
    cached = model.generate(idx, 200, temperature=0, use_cache=True)
    uncached = model.generate(idx, 200, temperature=0, use_cache=False)
    assert cached.shape == (1, prompt_len + 200)
    assert torch.equal(cached, uncached)


def test_sampled_generation_is_identical_with_and_without_the_cache():
    model = tiny_gpt()
    idx = prompt(10)
    cached = model.generate(idx, 150, temperature=0.8, top_k=20, generator=torch.Generator().manual_seed(3))
    uncached = model.generate(idx, 150, temperature=0.8, top_k=20, use_cache=False,
                              generator=torch.Generator().manual_seed(3))
    assert torch.equal(cached, uncached)


def test_prompt_longer_than_block_size_is_windowed_the_same_way_in_both_paths():
    model = tiny_gpt()
    idx = prompt(100)
    assert torch.equal(model.generate(idx, 80, temperature=0), model.generate(idx, 80, temperature=0, use_cache=False))


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_full_window_jumps_to_its_last_half_block(use_cache):
    model = tiny_gpt()
    fed = []  # per forward call: (token ids fed, tokens already in the cache)

    def record(module, args, kwargs):
        cache = args[1] if len(args) > 1 else kwargs.get("cache")
        fed.append((args[0], cache.length if cache is not None else 0))

    model.register_forward_pre_hook(record, with_kwargs=True)
    out = model.generate(prompt(64), 3, temperature=0, use_cache=use_cache)
    # windows out[:, start:end]: the prompt fills block_size 64; the 65th token makes it jump to the last 32
    windows = [(0, 64), (33, 65), (33, 66)]
    cached = [0, 0, 32] if use_cache else [0, 0, 0]
    assert len(fed) == len(windows)
    for (tokens, n_cached), (start, end), expected_cached in zip(fed, windows, cached):
        assert n_cached == expected_cached
        assert torch.equal(tokens, out[:, start + n_cached:end])


def test_cached_next_token_logits_equal_the_full_forward():
    model = tiny_gpt().eval()
    idx = prompt(30)
    cache = gpt.KVCache(len(model.blocks), model.block_size)
    model(idx[:, :20], cache)  # causal prefill
    model(idx[:, 20:29], cache)  # several new tokens after cached ones
    cached = model(idx[:, 29:], cache)[:, -1]
    assert cache.length == 30
    torch.testing.assert_close(cached, model(idx)[:, -1], atol=1e-5, rtol=0)


def test_generate_restores_training_mode():
    model = tiny_gpt().train()
    model.generate(prompt(5), 3)
    assert model.training


def test_lm_head_is_tied_to_the_token_embedding():
    model = tiny_gpt()
    assert model.lm_head.weight is model.wte.weight


@pytest.mark.parametrize("drawn_by", ["the constructor", "models.init_weights"])
def test_init_is_gpt2_with_scaled_residual_projections(drawn_by):
    n_layer = 8
    model = tiny_gpt(n_layer=n_layer, n_embd=256, n_head=4)
    if drawn_by == "models.init_weights":  # what train.py does: a generator per tensor, seeded from run.seed
        models.init_weights(model, seed=3)
    residual_std = 0.02 / math.sqrt(2 * n_layer)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            expected = residual_std if name.endswith("c_proj.weight") else 0.02
            assert p.std().item() == pytest.approx(expected, rel=0.1), name
            assert p.mean().abs().item() < 0.1 * expected, name
        elif name.endswith("bias"):
            assert torch.count_nonzero(p) == 0, name
        else:
            assert torch.all(p == 1), name  # LayerNorm gains
    assert model.lm_head.weight is model.wte.weight


def test_init_is_deterministic_given_the_seed():
    a, b = tiny_gpt(seed=5), tiny_gpt(seed=5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_flops_per_token_matches_the_palm_formula_by_hand():
    V, T, L, H, C = 256, 64, 2, 2, 64
    model = tiny_gpt()
    per_block = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    n = V * C + L * per_block + 2 * C  # tied embedding once, blocks, ln_f; no position embedding
    assert model.flops_per_token() == 6 * n + 12 * L * H * (C // H) * T


@pytest.mark.parametrize("option", ["GPT-2", *OPTIONS])
def test_activation_checkpointing_gives_bitwise_equal_gradients(option):
    idx = prompt(64)
    grads = []
    for checkpointing in (False, True):
        model = tiny_gpt(**OPTIONS.get(option, {})).train()
        model.checkpointing = checkpointing
        logits = model(idx)
        F.cross_entropy(logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten()).backward()
        grads.append([p.grad for p in model.parameters()])
    assert all(torch.equal(g, h) for g, h in zip(*grads))


def test_activation_checkpointing_saves_fewer_tensors_for_backward():
    def saved_tensors(checkpointing: bool) -> int:
        model = tiny_gpt().train()
        model.checkpointing = checkpointing
        count = 0

        def pack(t):
            nonlocal count
            count += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(prompt(64))
        return count

    assert saved_tensors(True) < saved_tensors(False) / 2


def test_sequence_longer_than_block_size_raises():
    model = tiny_gpt()
    with pytest.raises(ValueError, match="block_size"):
        model(prompt(65))


def test_n_embd_not_divisible_by_n_head_raises():
    with pytest.raises(ValueError, match=r"n_embd \(64\).*n_head \(3\)"):
        tiny_gpt(n_head=3)


@pytest.mark.parametrize("option", OPTIONS)
def test_every_option_generates_the_same_tokens_with_and_without_the_cache_past_the_block_size(option):
    model = tiny_gpt(**OPTIONS[option])
    idx = prompt(10)
    assert torch.equal(model.generate(idx, 200, temperature=0), model.generate(idx, 200, temperature=0, use_cache=False))


@pytest.mark.parametrize("option", OPTIONS)
def test_every_option_has_each_parameter_drawn_by_init_tensor_as_fsdp_builds_it(option):
    model = tiny_gpt(**OPTIONS[option])
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))  # what to_empty leaves is garbage: a tensor the rule missed would keep it
    models.init_weights(model, seed=3)
    assert [name for name, p in model.named_parameters() if p.isnan().any()] == []


def test_rotary_attention_scores_depend_on_the_relative_position_only():
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(query_at: int, key_at: int) -> torch.Tensor:
        return (gpt.rotate(q, query_at) * gpt.rotate(k, key_at)).sum()

    torch.testing.assert_close(score(5, 2), score(105, 102))
    assert not torch.allclose(score(5, 2), score(5, 4))


def test_swiglu_at_eight_thirds_width_holds_the_gelu_mlps_parameters_within_one_percent():
    def count(kind: str) -> int:
        return sum(p.numel() for p in gpt.MLP(192, 0.0, False, kind).parameters())

    assert count("swiglu") == pytest.approx(count("gelu"), rel=0.01)
    assert count("relu2") == count("gelu")


def test_the_soft_cap_keeps_every_logit_inside_it():
    model = tiny_gpt(logit_softcap=2.0)
    model.lm_head.weight.data.mul_(100)
    logits = model(prompt(20))
    model.logit_softcap = 0.0
    assert logits.abs().max() <= 2.0 < model(prompt(20)).abs().max()  # far beyond the cap without it


def test_flops_per_token_count_an_untied_head_and_no_position_embedding_under_rope():
    V, T, L, H, C = 256, 64, 2, 2, 64
    model = tiny_gpt(position="rope", tie_embeddings=False)
    per_block = 2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)
    n = 2 * V * C + L * per_block + 2 * C  # the embedding and the head apart, blocks, ln_f; no position embedding
    assert model.flops_per_token() == 6 * n + 12 * L * H * (C // H) * T
    assert model.wpe is None and model.lm_head.weight is not model.wte.weight


def test_an_odd_head_width_is_refused_under_rope():
    with pytest.raises(ValueError, match="head width 9 is odd"):
        tiny_gpt(n_embd=18, position="rope")


def test_a_modern_gpts_parameters_are_the_formulas():
    V, L, H, C = 256, 2, 2, 64
    hidden = round(8 * C / 3)  # SwiGLU's width
    per_block = 2 * C + (C * 3 * C + 3 * C) + 2 * (C // H) + (C * C + C) + (C * 2 * hidden + 2 * hidden) + (
        hidden * C + C)  # two RMSNorm gains, q/k/v, the QK-norm gains, the projection, SwiGLU's two matrices
    model = tiny_gpt(**MODERN)
    assert sum(p.numel() for p in model.parameters()) == 2 * V * C + L * per_block + C  # embedding, head, ln_f
