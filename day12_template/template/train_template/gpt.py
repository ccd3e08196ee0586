"""A GPT language model (decoder-only transformer, GPT-2 layout) with a KV cache for generation.

Standalone: imports only torch and the standard library. The model returns logits for every position; the trainer
computes the loss. Its repeated layers live in `self.blocks`, the units of activation checkpointing.
"""
import math
from collections.abc import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class KVCache:
    """Keys and values of every layer for the first `length` tokens of the current window.

    Buffers of shape (batch, heads, max_length, head_dim) are allocated on a layer's first `update`. GPT.forward
    writes the new tokens' k/v at positions length.. in every layer, then advances `length` by their number.
    """

    def __init__(self, n_layer: int, max_length: int):
        self.max_length = max_length
        self.length = 0
        self.k: list[torch.Tensor | None] = [None] * n_layer
        self.v: list[torch.Tensor | None] = [None] * n_layer

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v (batch, heads, new, head_dim) after the cached ones; return all of this layer's keys and values."""
        if self.k[layer] is None:
            batch, heads, _, head_dim = k.shape
            self.k[layer] = k.new_empty(batch, heads, self.max_length, head_dim)
            self.v[layer] = v.new_empty(batch, heads, self.max_length, head_dim)
        end = self.length + k.size(2)
        if end > self.max_length:
            raise ValueError(f"KV cache holds at most {self.max_length} tokens; {end} requested")
        self.k[layer][:, :, self.length:end] = k
        self.v[layer][:, :, self.length:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def reset(self) -> None:
        """Forget every cached token (the buffers are kept for reuse)."""
        self.length = 0


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention: one fused q/k/v projection, each position attending to itself and earlier ones."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        self.n_head = n_head
        self.dropout = dropout
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        B, T, C = x.shape
        # (B, T, 3C) -> three tensors of shape (B, heads, T, head_dim)
        q, k, v = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.update(layer, k, v)
        dropout_p = self.dropout if self.training else 0.0
        if past == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
        else:
            # new token i sits at position past + i and sees every key up to it (all cached ones included)
            mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(diagonal=past)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        return self.resid_drop(self.c_proj(y.transpose(1, 2).reshape(B, T, C)))


class MLP(nn.Module):
    """Position-wise feed-forward: Linear(C, 4C) -> GELU -> Linear(4C, C) -> dropout."""

    def __init__(self, n_embd: int, dropout: float, bias: bool):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias)
        self.ln2 = nn.LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, dropout, bias)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), cache, layer)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + learned position embeddings, `n_layer` blocks, a final LayerNorm and a head tied to the embedding."""

    checkpointing = False  # set True from outside to recompute each block in backward (training only)

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if n_embd % n_head != 0:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        self.block_size = block_size
        self.n_head = n_head
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, bias) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, bias=bias)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # one matrix embeds tokens and scores them
        for name, p in self.named_parameters():  # from the global RNG (the tied matrix appears once)
            self.init_tensor(name, p, generator=None)

    @torch.no_grad()
    def init_tensor(self, name: str, tensor: torch.Tensor, generator: torch.Generator | None) -> None:
        """GPT-2 init of parameter (or buffer: GPT has none) `name`: matrices N(0, 0.02), the projections into the residual stream (two per
        block) scaled down by sqrt(2 * n_layer), LayerNorm gains 1, biases 0."""
        if tensor.dim() == 2:
            std = 0.02 / math.sqrt(2 * len(self.blocks)) if name.endswith("c_proj.weight") else 0.02
            nn.init.normal_(tensor, mean=0.0, std=std, generator=generator)
        elif name.endswith("bias"):
            nn.init.zeros_(tensor)
        else:
            nn.init.ones_(tensor)

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits (B, T, vocab_size) for token ids idx (B, T); with a cache, idx follow the cached tokens."""
        T = idx.size(1)
        start = cache.length if cache is not None else 0
        if start + T > self.block_size:
            raise ValueError(f"{start + T} positions ({start} cached + {T} new) exceed block_size {self.block_size}")
        pos = torch.arange(start, start + T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        # a recomputed block would write the cache a second time, so checkpointing runs only without one
        use_checkpoint = self.checkpointing and self.training and torch.is_grad_enabled() and cache is None
        for layer, block in enumerate(self.blocks):
            if use_checkpoint:
                x = checkpoint(block, x, use_reentrant=False)  # keeps only x; the block's insides are recomputed
            else:
                x = block(x, cache, layer)
        if cache is not None:
            cache.length += T
        return self.lm_head(self.ln_f(x))

    def flops_per_token(self) -> int:
        """Training FLOPs per token as the PaLM paper (appendix B) counts them: 6*N + 12*L*H*Q*T.

        N: parameters without the position embedding (the tied wte/lm_head matrix counted once); 6N is the forward
        (2N) plus backward (4N) matrix multiplies. 12*L*H*Q*T is attention's scores and weighted sum over a full
        context: L layers, H heads, Q = head dim, T = block_size.
        """
        n = sum(p.numel() for p in self.parameters()) - self.wpe.weight.numel()
        head_dim = self.wte.embedding_dim // self.n_head
        return 6 * n + 12 * len(self.blocks) * self.n_head * head_dim * self.block_size

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 use_cache: bool = True, generator: torch.Generator | None = None) -> torch.Tensor:
        """Extend idx (B, T) by max_new_tokens sampled tokens; returns (B, T + max_new_tokens): generate_stream's
        tokens after idx."""
        return torch.cat([idx, *self.generate_stream(idx, max_new_tokens, temperature, top_k, use_cache, generator)],
                         dim=1)

    @torch.no_grad()
    def generate_stream(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                        top_k: int | None = None, use_cache: bool = True,
                        generator: torch.Generator | None = None) -> Iterator[torch.Tensor]:
        """Yield each of max_new_tokens sampled tokens (B, 1) as soon as it is drawn, so that a caller can show text
        while it is written, and keep it when stopped.

        Each token comes from `draw` on the last position's logits (temperature 0: the argmax; top_k). Window rule,
        the same with and without the cache: the model conditions on idx[:, start:], starting with the last
        block_size tokens of the prompt. When the window holds block_size tokens and one more is needed, start jumps
        so that the window keeps the last block_size // 2 tokens. The cached path then resets its cache and prefills
        those tokens, after which each step feeds one token again until the next jump, so the cache stays useful past
        block_size; the uncached path recomputes the whole window every step.
        The model runs in eval mode until the stream ends or is closed; its previous mode is restored then.
        """
        was_training = self.training
        self.eval()
        cache = KVCache(len(self.blocks), self.block_size) if use_cache else None
        start = max(0, idx.size(1) - self.block_size)
        try:
            for _ in range(max_new_tokens):
                if idx.size(1) - start > self.block_size:
                    start = idx.size(1) - self.block_size // 2
                    if cache is not None:
                        cache.reset()
                if cache is not None:
                    logits = self(idx[:, start + cache.length:], cache)[:, -1]
                else:
                    logits = self(idx[:, start:])[:, -1]
                next_token = draw(logits, temperature, top_k, generator)
                idx = torch.cat([idx, next_token], dim=1)
                yield next_token
        finally:
            self.train(was_training)


def draw(logits: torch.Tensor, temperature: float, top_k: int | None,
         generator: torch.Generator | None) -> torch.Tensor:
    """The next token (B, 1) from the last position's logits (B, vocabulary): the argmax at temperature 0; otherwise
    sampled from softmax(logits / temperature) (scale_logits), among the top_k largest when top_k is given."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = scale_logits(logits, temperature)
    if top_k is not None:
        kth_largest = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)


def scale_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature, except in a row whose largest quotient overflows (temperature 1e-40: softmax would make
    it NaN), which gets the limit as the temperature goes to 0 instead: 0 at the row's largest logits, -inf elsewhere,
    so sampling draws the argmax. Once the largest overflows that limit is exact: every smaller logit trails it by at
    least half an ulp, which over the temperature exceeds eps / 2 x the dtype's largest float (2e31 in fp32), and the
    exp of minus that is 0. A row that does not overflow keeps its quotients bit for bit, so ordinary temperatures
    draw the same tokens as before."""
    scaled = logits / temperature
    limit = torch.zeros_like(logits).masked_fill(logits < logits.amax(dim=-1, keepdim=True), float("-inf"))
    return torch.where(scaled.amax(dim=-1, keepdim=True).isfinite(), scaled, limit)
