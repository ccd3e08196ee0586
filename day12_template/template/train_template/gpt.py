"""A GPT language model (decoder-only transformer) with a KV cache for generation: GPT-2's layout by default, and
the parts of a modern one as options (RMSNorm, rotary positions, SwiGLU or ReLU² MLPs, QK-norm, a logit soft-cap,
an untied head, post-norm blocks for comparison).

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


def norm_layer(kind: str, width: int, bias: bool) -> nn.Module:
    """LayerNorm (GPT-2: centre, scale, gain and bias) or RMSNorm (Llama: scale and gain only, a little cheaper)."""
    if kind == "rmsnorm":
        return nn.RMSNorm(width)
    return nn.LayerNorm(width, bias=bias)


def rotate(x: torch.Tensor, start: int) -> torch.Tensor:
    """Rotary position embedding (RoPE, Su et al. 2021) of x (B, heads, T, head_dim) at positions start..start+T-1.

    Dimension pair (i, i + head_dim/2) turns by the angle position x 10000^(-2i/head_dim): a query at position m and
    a key at position n then score q.k through their rotations by m and n, which is a rotation by m - n alone, so
    attention sees relative positions, and nothing is learned or stored. Computed in fp32, returned in x's dtype."""
    half = x.size(-1) // 2
    inv_freq = 10000.0 ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angle = torch.arange(start, start + x.size(-2), device=x.device, dtype=torch.float32)[:, None] * inv_freq
    cos, sin = angle.cos(), angle.sin()  # (T, half), broadcast over batch and heads
    x1, x2 = x.float()[..., :half], x.float()[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention: one fused q/k/v projection, each position attending to itself and earlier ones;
    optionally queries and keys RMS-normalised per head (`qk_norm`, which bounds the attention logits) and rotated by
    their positions (`rope`)."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool, qk_norm: bool = False,
                 rope: bool = False):
        super().__init__()
        self.n_head = n_head
        self.dropout = dropout
        self.rope = rope
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.q_norm = nn.RMSNorm(n_embd // n_head) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(n_embd // n_head) if qk_norm else nn.Identity()
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        B, T, C = x.shape
        # (B, T, 3C) -> three tensors of shape (B, heads, T, head_dim)
        q, k, v = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        q, k = self.q_norm(q), self.k_norm(k)
        past = cache.length if cache is not None else 0
        if self.rope:  # the new tokens sit at positions past.. (the cached keys were rotated when they were new)
            q, k = rotate(q, past), rotate(k, past)
        if cache is not None:
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
    """Position-wise feed-forward, then dropout. gelu (GPT-2): Linear(C, 4C) -> GELU -> Linear(4C, C). relu2
    (Primer, modded-nanogpt): the same with ReLU(x)². swiglu (PaLM, Llama): Linear(C, 2H) split into a gate and a
    value, SiLU(gate) x value -> Linear(H, C), with H = 8C/3 so that its three matrices hold the two's parameters."""

    def __init__(self, n_embd: int, dropout: float, bias: bool, kind: str = "gelu"):
        super().__init__()
        self.kind = kind
        hidden, fc_out = 4 * n_embd, 4 * n_embd
        if kind == "swiglu":  # one matrix makes the gate and the value: twice the hidden width
            hidden = round(8 * n_embd / 3)
            fc_out = 2 * hidden
        self.c_fc = nn.Linear(n_embd, fc_out, bias=bias)
        self.c_proj = nn.Linear(hidden, n_embd, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c_fc(x)
        if self.kind == "swiglu":
            gate, value = h.chunk(2, dim=-1)
            h = F.silu(gate) * value
        elif self.kind == "relu2":
            h = F.relu(h).square()
        else:
            h = F.gelu(h)
        return self.drop(self.c_proj(h))


class Block(nn.Module):
    """A transformer block. Pre-norm (GPT-2 and later): x + attn(ln1(x)), then x + mlp(ln2(x)): the residual stream
    itself is never normalised. Post-norm (the 2017 Transformer): ln1(x + attn(x)), then ln2(x + mlp(x))."""

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool, norm: str = "layernorm",
                 mlp: str = "gelu", qk_norm: bool = False, rope: bool = False, post_norm: bool = False):
        super().__init__()
        self.post_norm = post_norm
        self.ln1 = norm_layer(norm, n_embd, bias)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout, bias, qk_norm, rope)
        self.ln2 = norm_layer(norm, n_embd, bias)
        self.mlp = MLP(n_embd, dropout, bias, mlp)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        if self.post_norm:
            x = self.ln1(x + self.attn(x, cache, layer))
            return self.ln2(x + self.mlp(x))
        x = x + self.attn(self.ln1(x), cache, layer)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token embeddings (+ learned position embeddings, unless rotary or none), `n_layer` blocks, a final norm
    (pre-norm only) and a head, tied to the token embedding unless `tie_embeddings=False`; logits optionally
    soft-capped."""

    checkpointing = False  # set True from outside to recompute each block in backward (training only)

    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int,
                 dropout: float = 0.0, bias: bool = True, norm: str = "layernorm", position: str = "learned",
                 mlp: str = "gelu", qk_norm: bool = False, logit_softcap: float = 0.0, tie_embeddings: bool = True,
                 norm_placement: str = "pre"):
        super().__init__()
        if n_embd % n_head != 0:
            raise ValueError(f"n_embd ({n_embd}) must be divisible by n_head ({n_head})")
        if position == "rope" and (n_embd // n_head) % 2:
            raise ValueError(f"rotary positions turn pairs of dimensions: the head width {n_embd // n_head} is odd")
        self.block_size = block_size
        self.n_head = n_head
        self.logit_softcap = logit_softcap
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd) if position == "learned" else None
        self.drop = nn.Dropout(dropout)
        post_norm = norm_placement == "post"
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout, bias, norm, mlp, qk_norm, position == "rope",
                                          post_norm) for _ in range(n_layer))
        self.ln_f = nn.Identity() if post_norm else norm_layer(norm, n_embd, bias)  # post-norm blocks end normalised
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.wte.weight  # one matrix embeds tokens and scores them
        for name, p in self.named_parameters():  # from the global RNG (the tied matrix appears once)
            self.init_tensor(name, p, generator=None)

    @torch.no_grad()
    def init_tensor(self, name: str, tensor: torch.Tensor, generator: torch.Generator | None) -> None:
        """GPT-2 init of parameter (or buffer: GPT has none) `name`: matrices N(0, 0.02), the projections into the
        residual stream (two per block) scaled down by sqrt(2 * n_layer), norm gains 1 (QK-norm's too), biases 0."""
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
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(start, start + T, device=idx.device))
        x = self.drop(x)
        # a recomputed block would write the cache a second time, so checkpointing runs only without one
        use_checkpoint = self.checkpointing and self.training and torch.is_grad_enabled() and cache is None
        for layer, block in enumerate(self.blocks):
            if use_checkpoint:
                x = checkpoint(block, x, use_reentrant=False)  # keeps only x; the block's insides are recomputed
            else:
                x = block(x, cache, layer)
        if cache is not None:
            cache.length += T
        logits = self.lm_head(self.ln_f(x))
        if self.logit_softcap:  # Gemma 2: cap x tanh(logits / cap) keeps every logit within +-cap, smoothly
            logits = self.logit_softcap * torch.tanh(logits / self.logit_softcap)
        return logits

    def flops_per_token(self) -> int:
        """Training FLOPs per token as the PaLM paper (appendix B) counts them: 6*N + 12*L*H*Q*T.

        N: parameters without the position embedding (a tied wte/lm_head matrix counted once, an untied head
        apart); 6N is the forward (2N) plus backward (4N) matrix multiplies. 12*L*H*Q*T is attention's scores and
        weighted sum over a full context: L layers, H heads, Q = head dim, T = block_size.
        """
        n = sum(p.numel() for p in self.parameters())
        if self.wpe is not None:
            n -= self.wpe.weight.numel()
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
