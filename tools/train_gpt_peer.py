#!/usr/bin/env python3
"""train_gpt's peer in PyTorch: the same byte-level GPT, data, batches and training.

apps/train_gpt trains a small GPT on torchattn::MultiHeadAttention (C++, LibTorch).
This script trains the same model the way a PyTorch user would write it, so that the
two can be compared on one machine (a GPU above all): loss curves and tokens/s.

  .venv/bin/python tools/train_gpt_peer.py [--steps 1500] [--out runs/gpt_peer]
      [--device cpu|cuda] [--precision auto|fp32|bf16] [--json runs/gpt_peer/peer.json]

What it shares with train_gpt (same seed -> the same numbers, up to float rounding):
- the model: token + position embeddings, pre-norm blocks (LayerNorm -> attention ->
  residual, LayerNorm -> MLP -> residual), a final LayerNorm, the head tied to the
  token embedding; the parameters are registered in train_gpt's order under its names,
  so torch.manual_seed(seed) and GPT-2's re-initialisation draw the same weights;
- the attention: q/k/v Linear (with bias) -> heads ->
  F.scaled_dot_product_attention(is_causal=True) -> merge -> out_proj;
- the data (--data files, by default Debian's fortunes), its 90/10 split and the
  batches (offsets from a CPU generator seeded with seed * 1000003 + step);
- AdamW (matrices decayed, the rest not), the learning-rate schedule, gradient
  clipping, the eval loss, the flags and loss.csv's columns;
- --device cuda: bf16 autocast for forward and loss (--precision bf16, the default
  there), float32 master weights; --precision fp32 turns it off.

Differences: with dropout > 0 on CUDA the attention's dropout masks differ (SDPA's
fused kernels draw their own; train_gpt's Auto backend then takes its step-by-step
Reference attention, which calls ATen's dropout; on the CPU SDPA's math kernel does
the same, so the masks match there). No data parallelism, checkpoints or sampling. --threads sets
torch.set_num_threads; --sample-tokens is accepted and ignored.

Output: --out/loss.csv (step,train_loss,eval_loss,lr,tokens_per_s, as train_gpt's),
--out/final.pt (the state dict; compare with train_gpt's final_rank0.pt through
tools/torchattn_interop.load), a JSON summary (--json, default --out/peer.json) and
a last stdout line `peer: tokens/s N final train X eval Y`. The summary's tokens/s
counts the training steps after the first --timing-warmup ones (batch, forward,
backward, clip, AdamW, each timed to its loss.item(), after torch.cuda.synchronize on
CUDA), eval excluded; the CSV's tokens_per_s is train_gpt's running figure (all steps
and evals since the start).
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH_SEED_STRIDE = 1000003  # train_gpt's batch(): generator seed = seed * stride + step
UINT64 = (1 << 64) - 1  # train_gpt's seeds are uint64_t and wrap
TRAIN_FRACTION = (9, 10)  # the first 9/10 of the bytes train, the rest is held out
MIN_TEXT_BYTES = 10000
DEFAULT_FORTUNES = "/usr/share/games/fortunes"
SKIPPED_EXTENSIONS = (".dat", ".u8")
VOCAB_SIZE = 256  # bytes
INIT_STD = 0.02  # GPT-2's initialisation
ADAM_BETAS = (0.9, 0.95)
LR_FLOOR = 0.1  # cosine decay to lr * LR_FLOOR


# ---- the model ---------------------------------------------------------------------


class MultiHeadAttention(nn.Module):
    """torchattn::MultiHeadAttention (causal, qkv_bias) on F.scaled_dot_product_attention."""

    def __init__(self, d_model, context_length, n_head, dropout):
        super().__init__()
        self.n_head = n_head
        self.dropout_p = dropout
        self.W_query = nn.Linear(d_model, d_model, bias=True)
        self.W_key = nn.Linear(d_model, d_model, bias=True)
        self.W_value = nn.Linear(d_model, d_model, bias=True)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)  # registered as in C++; SDPA applies dropout_p
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def split_heads(self, t):
        B, T, d = t.shape
        return t.view(B, T, self.n_head, d // self.n_head).transpose(1, 2)

    def forward(self, x):
        B, T, d = x.shape
        # The C++ projects keys first, then queries and values.
        k = self.split_heads(self.W_key(x))
        q = self.split_heads(self.W_query(x))
        v = self.split_heads(self.W_value(x))
        p = self.dropout_p if self.training else 0.0
        context = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.out_proj(context.transpose(1, 2).reshape(B, T, d))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg.d_model
        self.ln1 = nn.LayerNorm(d)
        self.attn = MultiHeadAttention(d, cfg.context, cfg.heads, cfg.dropout)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.Dropout(cfg.dropout))

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.mlp(self.ln2(h))


class GPT(nn.Module):
    """apps/train_gpt/gpt.cpp's GPTImpl: same modules, same order, same names."""

    def __init__(self, cfg):
        super().__init__()
        self.context = cfg.context
        self.tok_emb = nn.Embedding(VOCAB_SIZE, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        gpt2_init_(self, cfg.layers)

    def forward(self, idx):
        T = idx.size(1)
        assert T <= self.context, f"GPT: expected at most context_length={self.context} tokens, got {T}"
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.tok_emb.weight)  # head tied to the embedding


@torch.no_grad()
def gpt2_init_(model, n_layer):
    """GPT-2's initialisation, in named_parameters order as in the C++."""
    residual_std = INIT_STD / math.sqrt(2.0 * n_layer)
    for name, p in model.named_parameters():
        if "ln" in name or "mask" in name:
            continue
        if name.endswith(".bias"):
            p.zero_()
        else:
            residual = "out_proj.weight" in name or "mlp.2.weight" in name
            p.normal_(0.0, residual_std if residual else INIT_STD)


# ---- data --------------------------------------------------------------------------


def default_data():
    """The fortune files (sorted, no .dat/.u8), as train_gpt's default_data()."""
    folder = os.environ.get("TORCHATTN_FORTUNES", DEFAULT_FORTUNES)
    if not os.path.isdir(folder):
        return []
    files = [e.path for e in os.scandir(folder)
             if e.is_file() and os.path.splitext(e.name)[1] not in SKIPPED_EXTENSIONS]
    return sorted(files, key=os.fsencode)


def load_text(files):
    """All files' bytes, concatenated -> (train, eval) uint8 tensors."""
    if not files:
        sys.exit("train_gpt_peer: no text: pass --data FILE, or install Debian's `fortunes` package")
    data = b"".join(open(f, "rb").read() for f in files)
    if len(data) <= MIN_TEXT_BYTES:
        sys.exit(f"train_gpt_peer: expected at least {MIN_TEXT_BYTES} bytes of text, got {len(data)}")
    cut = len(data) * TRAIN_FRACTION[0] // TRAIN_FRACTION[1]
    all_bytes = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return all_bytes[:cut].clone(), all_bytes[cut:].clone(), f"{len(files)} file(s), {len(data)} bytes"


def batch(data, T, size, seed, step):
    """Inputs and next-byte targets [size, T]; offsets depend on (seed, step) only."""
    gen = torch.Generator().manual_seed((seed * BATCH_SEED_STRIDE + step) & UINT64)
    offsets = torch.randint(len(data) - T - 1, (size,), generator=gen)
    rows = data[offsets.unsqueeze(1) + torch.arange(T + 1)].long()
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


# ---- training ----------------------------------------------------------------------


def lr_at(step, steps, warmup, lr):
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (LR_FLOOR + (1 - LR_FLOOR) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def make_optimizer(model, lr, weight_decay, fused=False):
    """AdamW as PyTorch's default picks it (foreach on CUDA), or fused=True."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=ADAM_BETAS,
                             fused=True if fused else None)


def autocast(device, amp):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp)


def loss_of(model, x, y, device, amp):
    with autocast(device, amp):
        logits = model(x.to(device, non_blocking=True))
        return F.cross_entropy(logits.view(-1, VOCAB_SIZE), y.to(device, non_blocking=True).view(-1))


@torch.no_grad()
def eval_loss(model, data, args, device, amp):
    model.eval()
    total = sum(loss_of(model, *batch(data, args.context, args.batch_size, args.seed + 1, i), device, amp).item()
                for i in range(args.eval_batches))
    model.train()
    return total / args.eval_batches


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_step(model, opt, train, step, args, device, amp):
    """One optimizer step -> (train loss, lr)."""
    x, y = batch(train, args.context, args.batch_size, args.seed, step)
    loss = loss_of(model, x, y, device, amp)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    step_lr = lr_at(step, args.steps, args.warmup, args.lr)
    for group in opt.param_groups:
        group["lr"] = step_lr
    opt.step()
    return loss.item(), step_lr


def cpp_double(x):
    """A double as C++'s ostream << writes it (6 significant digits)."""
    return f"{x:.6g}"


# ---- command line ------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", action="append", default=[], help="UTF-8 text file(s) (default: the fortunes)")
    p.add_argument("--steps", type=int, default=1500, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    p.add_argument("--context", type=int, default=128, help="tokens per sequence")
    p.add_argument("--d-model", type=int, default=128, help="model width")
    p.add_argument("--layers", type=int, default=4, help="blocks")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout in attention and MLP")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    p.add_argument("--warmup", type=int, default=100, help="linear warm-up steps, then cosine decay to lr/10")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay on matrices")
    p.add_argument("--clip", type=float, default=1.0, help="gradient-norm clipping")
    p.add_argument("--fused-adamw", action="store_true",
                   help="AdamW(fused=True), as train_gpt --optimizer fused (default: PyTorch's own choice)")
    p.add_argument("--eval-every", type=int, default=250, help="steps between eval losses (0: only at the end)")
    p.add_argument("--eval-batches", type=int, default=8, help="batches in one eval loss")
    p.add_argument("--seed", type=int, default=1337, help="weights and batches")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    p.add_argument("--out", default="runs/gpt_peer", help="loss.csv, final.pt and peer.json go here")
    p.add_argument("--json", default=None, help="summary JSON (default: OUT/peer.json)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cpu, or cuda (one GPU)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                   help="auto (bf16 on cuda, fp32 on cpu), fp32, or bf16 (CUDA autocast)")
    p.add_argument("--timing-warmup", type=int, default=10, help="first steps left out of the summary's tokens/s")
    p.add_argument("--sample-tokens", type=int, default=0, help="accepted for train_gpt's command lines; ignored")
    args = p.parse_args(argv)
    for name in ("steps", "batch_size", "context", "d_model", "layers", "heads", "eval_batches"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.d_model % args.heads:
        p.error("--d-model must be divisible by --heads")
    if args.precision == "bf16" and args.device != "cuda":
        p.error("--precision bf16 is CUDA autocast; use it with --device cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda, but this PyTorch sees no CUDA device")
    return args


def device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def main(argv=None):
    args = parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    amp = device.type == "cuda" and args.precision != "fp32"
    train, held_out, source = load_text(args.data or default_data())

    torch.manual_seed(args.seed)
    model = GPT(args).to(device)
    torch.manual_seed(args.seed)  # train_gpt: seed + rank, rank 0
    opt = make_optimizer(model, args.lr, args.weight_decay, args.fused_adamw)
    n_params = sum(p.numel() for p in model.parameters())
    tokens_per_step = args.batch_size * args.context
    print(f"train_gpt_peer: {source}; {n_params} parameters; {args.batch_size} sequences of {args.context} bytes; "
          f"{torch.get_num_threads()} thread(s)", file=sys.stderr)
    print(f"train_gpt_peer: device {device_name(device)}, "
          f"{'bf16 autocast, float32 master weights' if amp else 'float32'}", file=sys.stderr)

    os.makedirs(args.out, exist_ok=True)
    step_seconds, train_loss, ev = [], float("nan"), float("nan")
    report_every = max(1, args.steps // 20)
    model.train()
    with open(os.path.join(args.out, "loss.csv"), "w") as csv:
        csv.write("step,train_loss,eval_loss,lr,tokens_per_s\n")
        t0 = time.perf_counter()
        for step in range(args.steps):
            sync(device)
            s0 = time.perf_counter()
            train_loss, step_lr = train_step(model, opt, train, step, args, device, amp)
            sync(device)
            now = time.perf_counter()
            step_seconds.append(now - s0)
            running_tok_s = (step + 1) * tokens_per_step / (now - t0)
            last = step + 1 == args.steps
            ev = float("nan")
            if last or (args.eval_every > 0 and (step + 1) % args.eval_every == 0):
                ev = eval_loss(model, held_out, args, device, amp)
            csv.write(f"{step + 1},{cpp_double(train_loss)},{'' if math.isnan(ev) else f'{ev:.6f}'},"
                      f"{cpp_double(step_lr)},{cpp_double(running_tok_s)}\n")
            csv.flush()
            if last or (step + 1) % report_every == 0 or not math.isnan(ev):
                eval_text = "" if math.isnan(ev) else f", eval loss {ev:.4f}"
                print(f"step {step + 1}/{args.steps}: train loss {train_loss:.4f}{eval_text} | "
                      f"{running_tok_s:.0f} tok/s", file=sys.stderr)
    torch.save(dict(model.state_dict()), os.path.join(args.out, "final.pt"))

    timed = step_seconds[args.timing_warmup:] if len(step_seconds) > args.timing_warmup else step_seconds
    overall = tokens_per_step * len(timed) / sum(timed)
    median = tokens_per_step / statistics.median(timed)
    summary = {
        "tokens_per_s": overall,
        "tokens_per_s_median_step": median,
        "timed_steps": len(timed),
        "final_train_loss": train_loss,
        "final_eval_loss": ev,
        "device": device_name(device),
        "precision": "bf16 autocast" if amp else "fp32",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "parameters": n_params,
        "data": source,
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "sample_tokens")},
    }
    with open(args.json or os.path.join(args.out, "peer.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"peer: tokens/s {overall:.0f} final train {train_loss:.4f} eval {ev:.4f}")


if __name__ == "__main__":
    main()
