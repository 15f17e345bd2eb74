"""The notebooks' own code (../shared/seeds), gathered as the Python reference.

Each class and function below is copied from the notebook named beside it, with only
the debugging prints removed and one addition: a `scale=None` keyword. None keeps the
notebook's division by sqrt(d_k); a number multiplies the scores instead, as
torchattn's `.scale(s)` does. torchattn is checked against this file: golden
fixtures (tests/reference/make_golden.py), the installed-package check
(tests/consumer/check_consumer.py) and the benchmarks (apps/bench/attention/bench_python.py).
"""

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# Notebooks 000, 001: "Your journey starts with one step".
INPUTS = torch.tensor(
    [[0.43, 0.15, 0.89],  # Your     (x^1)
     [0.55, 0.87, 0.66],  # journey  (x^2)
     [0.57, 0.85, 0.64],  # starts   (x^3)
     [0.22, 0.58, 0.33],  # with     (x^4)
     [0.77, 0.25, 0.10],  # one      (x^5)
     [0.05, 0.80, 0.55]]  # step     (x^6)
)


class SelfAttentionV2(nn.Module):  # notebook 001
    def __init__(self, d_in, d_out, qkv_bias=False, scale=None):
        super().__init__()
        self.scale = scale
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x):
        queries = self.W_query(x)
        keys = self.W_key(x)
        values = self.W_value(x)

        # The notebook writes keys.T for its 2-D input; transpose(-2, -1) is the same
        # there and also serves batches.
        attn_scores = queries @ keys.transpose(-2, -1)
        if self.scale is None:
            attn_weights_scaled = attn_scores / torch.sqrt(torch.tensor(keys.shape[-1]))
        else:
            attn_weights_scaled = attn_scores * self.scale
        attn_weights = torch.softmax(attn_weights_scaled, dim=-1)

        context_matrix = attn_weights @ values
        return context_matrix


class CausalAttention(nn.Module):  # notebook 003
    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False, scale=None):
        super().__init__()
        self.scale = scale
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer('mask', torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        keys = self.W_key(x)
        queries = self.W_query(x)
        values = self.W_value(x)

        attn_scores = queries @ keys.transpose(1, 2)
        attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = torch.softmax(
            attn_scores / keys.shape[-1]**0.5 if self.scale is None else attn_scores * self.scale, dim=-1)
        attn_weights = self.dropout(attn_weights)

        context_vec = attn_weights @ values
        return context_vec


class MultiHeadAttention(nn.Module):  # notebook 003
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False, scale=None):
        super().__init__()
        self.scale = scale
        assert (d_out % num_heads == 0), \
            "d_out must be divisible by num_heads"

        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads

        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer(
            "mask",
            torch.triu(torch.ones(context_length, context_length), diagonal=1)
        )

    def forward(self, x):
        b, num_tokens, d_in = x.shape

        keys = self.W_key(x)
        queries = self.W_query(x)
        values = self.W_value(x)

        keys = keys.view(b, num_tokens, self.num_heads, self.head_dim)
        values = values.view(b, num_tokens, self.num_heads, self.head_dim)
        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim)

        keys = keys.transpose(1, 2)
        queries = queries.transpose(1, 2)
        values = values.transpose(1, 2)

        attn_scores = queries @ keys.transpose(2, 3)
        mask_bool = self.mask.bool()[:num_tokens, :num_tokens]
        attn_scores.masked_fill_(mask_bool, -torch.inf)

        attn_weights = torch.softmax(
            attn_scores / keys.shape[-1]**0.5 if self.scale is None else attn_scores * self.scale, dim=-1)
        attn_weights = self.dropout(attn_weights)

        context_vec = (attn_weights @ values).transpose(1, 2)
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)
        context_vec = self.out_proj(context_vec)

        return context_vec


def dot_product_attention_weights(q, k, mask=None, scale=True):  # notebook 002
    matmul_qk = q @ k.transpose(-2, -1)
    if scale:
        dk = torch.tensor(k.shape[-1], dtype=torch.float)
        matmul_qk /= torch.sqrt(dk)
    if mask is not None:
        matmul_qk = matmul_qk + (1 - mask) * -1e9
    return F.softmax(matmul_qk, dim=-1)


def dot_product_attention(q, k, v, mask=None, scale=True):  # notebook 002
    return dot_product_attention_weights(q, k, mask, scale) @ v


def causal_dot_product_attention(q, k, v, scale=True):  # notebook 002
    mask_size = q.shape[-2]
    mask = torch.tril(torch.ones(mask_size, mask_size))
    return dot_product_attention(q, k, v, mask=mask, scale=scale)


def make_causal_mask(T, neg_large=-1e9):  # notebook 004
    m = np.triu(np.ones((T, T), dtype=np.float64), k=1)
    mask = m * neg_large
    return mask


def softmax(x, axis=-1):  # notebook 004
    x = x - np.max(x, axis=axis, keepdims=True)
    ex = np.exp(x)
    return ex / np.sum(ex, axis=axis, keepdims=True)
