#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""train_lm.py: a small byte-level transformer language model trained through tierd.

The model's parameters, gradients and AdamW state live in tierd (tier.torch);
the text is Python's own standard library, which every Debian machine has.
Each step prints the loss, tokens per second, the time spent waiting for
tierd (stall) and the bytes tierd moved for the job over each link.

    /usr/bin/python3 train_lm.py --steps 20                       # through tierd
    /usr/bin/python3 train_lm.py --steps 20 --plain               # plain PyTorch, for comparison
    torchrun --nproc_per_node 2 train_lm.py --steps 20            # two ranks (gloo), one job
    python3 train_lm.py --model gpt2 --host-limit 500M --steps 5  # GPT-2 small (Hugging Face), 2 GB of state

``--model gpt2`` trains Hugging Face's GPT-2 small (124 M parameters, tied
embeddings, random init: nothing is downloaded) on the same bytes as token
ids; it needs transformers, which Debian 12 lacks: use a python that has it
(``./scripts/test`` makes one, ``.venv-tests/bin/python3``, over Debian's
torch).

With ``--plain`` nothing touches tierd.  Both runs draw the same batches from
the same seed and, on the CPU, print the same losses.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.isdir(os.path.join(HERE, "..", "tier")):
    sys.path.insert(0, os.path.join(HERE, ".."))      # run from the source tree


# ---- the model --------------------------------------------------------------------------------

class Block(torch.nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP, each with a residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(dim)
        self.attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class ByteLM(torch.nn.Module):
    """Decoder-only transformer over bytes (vocabulary 256)."""

    def __init__(self, dim: int, layers: int, heads: int, context: int) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(256, dim)
        self.pos = torch.nn.Embedding(context, dim)
        self.blocks = torch.nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.ln = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, 256)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


# ---- data ----------------------------------------------------------------------------------------

def load_text(pattern: str, limit: int) -> torch.Tensor:
    """Bytes of the files matching ``pattern`` (sorted, so every run reads the same), up to ``limit``."""
    chunks: list[bytes] = []
    n = 0
    for path in sorted(glob.glob(pattern, recursive=True)):
        try:
            with open(path, "rb") as f:
                b = f.read(limit - n)
        except OSError:
            continue
        chunks.append(b)
        n += len(b)
        if n >= limit:
            break
    if n < 4096:
        raise SystemExit(f"train_lm: found only {n} bytes of text in {pattern}")
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).long()


def batches(text: torch.Tensor, batch: int, context: int, seed: int, rank: int, world: int):
    """Random windows, the same sequence for a given seed; rank r of w takes rows r, r+w, ..."""
    g = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, len(text) - context - 1, (batch * world,), generator=g)
        mine = starts[rank::world]
        x = torch.stack([text[s:s + context + 1] for s in mine.tolist()])
        yield x[:, :-1], x[:, 1:]


# ---- main ---------------------------------------------------------------------------------------

def size(text: str) -> int:
    """'8M', '512K', '1G' or bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        return int(t[:-1]) * units[t[-1]] if t and t[-1] in units else int(t)
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8M)") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Train a byte-level transformer LM with its state in tierd.")
    p.add_argument("--socket", help="tierd's socket (default: libtier's, or $TIER_SOCKET)")
    p.add_argument("--job", default="train-lm", help="tierd job name (all ranks share it)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--model", choices=("bytelm", "gpt2"), default="bytelm",
                   help="bytelm: the model below (--dim, --layers, --heads); gpt2: Hugging Face's GPT-2 small")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=16, help="sequences per step, over all ranks")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per step (gradient accumulation)")
    p.add_argument("--clip", type=float, help="clip the gradients' global norm to this before each step")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--placement", choices=("A", "B", "C"), default="C",
                   help="A: state in host memory; B: optimizer state on NVMe; C: parameters too (default)")
    p.add_argument("--offload-activations", action="store_true",
                   help="keep the activations autograd saves in tierd between forward and backward")
    p.add_argument("--text", default="/usr/lib/python3*/**/*.py", help="glob of text files to learn from")
    p.add_argument("--text-bytes", type=int, default=4 << 20)
    p.add_argument("--host-limit", type=size, help="set the job's host memory limit (a quota; needs root "
                   "or tierd's admin group), e.g. 8M")
    p.add_argument("--vram-limit", type=size, help="set the job's VRAM limit likewise")
    p.add_argument("--plain", action="store_true", help="plain PyTorch, without tierd")
    p.add_argument("--describe", action="store_true", help="print tier.torch's blocks and what the budgets "
                   "mean for them (Offload.describe()) before training")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where the model computes: auto is the GPU when tierd's VRAM is a GPU's (or, with "
                   "--plain, when torch sees one), else the CPU")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        torch.distributed.init_process_group("gloo")
    if args.batch % world:
        raise SystemExit(f"train_lm: --batch {args.batch} is not a multiple of the {world} ranks")

    torch.manual_seed(args.seed)
    vocab = 256
    if args.model == "gpt2":
        try:
            import transformers
        except ImportError:
            raise SystemExit("train_lm: --model gpt2 needs transformers (pip install transformers==4.36.2 into a "
                             "venv made with --system-site-packages, or use ./scripts/test's .venv-tests/bin/python3)"
                             ) from None
        transformers.logging.set_verbosity_error()
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_positions=max(1024, args.context)))
        vocab = model.config.vocab_size
    else:
        model = ByteLM(args.dim, args.layers, args.heads, args.context)
    n_params = sum(p.numel() for p in model.parameters())
    text = load_text(args.text, args.text_bytes)
    data = batches(text, args.batch // world, args.context, args.seed, rank, world)
    loss_fn = torch.nn.functional.cross_entropy

    client = engine = None
    device = torch.device("cpu")
    if args.plain:
        if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()):
            device = torch.device("cuda")
        model.to(device)
        if world > 1:
            model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    else:
        import tier
        import tier.torch

        client = tier.Client(args.job, rank=rank, socket=args.socket)
        if args.device == "cuda" or (args.device == "auto" and client.vram_backend == "cuda"):
            if client.vram_backend != "cuda":
                raise SystemExit(f"train_lm: --device cuda, but tierd's VRAM is {client.vram_backend}")
            device = torch.device("cuda")
            model.to(device)
        if (args.host_limit or args.vram_limit) and rank == 0:
            # the budgets: smaller than the state, they make tierd use the NVMe tier
            client.set_quota(host=args.host_limit, vram=args.vram_limit)
        if world > 1:
            torch.distributed.barrier()             # every rank plans within the new limits
        engine = tier.torch.Offload(model, client, lr=args.lr, placement=args.placement,
                                    offload_activations=args.offload_activations)
        if args.describe and rank == 0:
            print(engine.describe())

    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"train_lm: {n_params / 1e6:.2f} M parameters ({n_params * 16 / 2**20:.1f} MiB with gradients and "
        f"AdamW state), {len(text) / 2**20:.1f} MiB of text, {world} rank(s), "
        + ("plain PyTorch" if args.plain else f"tierd job '{args.job}', placement {args.placement}, "
           f"vram backend {client.vram_backend}"))
    if client:
        q = client.quota()
        say(f"train_lm: job limits: vram {q.limits['vram'] / 2**20:.1f} MiB, host {q.limits['host'] / 2**20:.1f} MiB,"
            f" nvme {q.limits['nvme'] / 2**20:.1f} MiB")
    moved = client.moved() if client else {}
    stall = 0.0
    t_all = time.monotonic()
    for step in range(args.steps):
        t0 = time.monotonic()
        value = torch.zeros(())
        for _ in range(args.accumulate):
            x, y = next(data)
            x, y = x.to(device), y.to(device)
            logits = model(x)
            logits = logits.logits if hasattr(logits, "logits") else logits
            loss = loss_fn(logits.reshape(-1, vocab), y.reshape(-1)) / args.accumulate
            loss.backward()
            value += loss.detach().cpu()
        if args.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)   # through tierd too
        if engine:
            engine.step()
            engine.zero_grad()
        else:
            opt.step()
            opt.zero_grad()
        dt = time.monotonic() - t0
        if world > 1:
            torch.distributed.all_reduce(value)
            value /= world
        tokens = args.batch * args.context * args.accumulate
        line = f"step {step + 1:4d}  loss {value.item():.6f}  {tokens / dt:9.0f} tok/s  {dt * 1e3:7.1f} ms"
        if client:
            now = client.moved()
            st = engine.stall
            per = ", ".join(f"{k} {(now[k] - moved.get(k, 0)) / 2**20:.1f}" for k in now if now[k] != moved.get(k, 0))
            line += f"  stall {(st - stall) * 1e3:6.1f} ms  MiB moved: {per or 'none'}"
            moved, stall = now, st
        say(line)
    say(f"train_lm: {args.steps} steps in {time.monotonic() - t_all:.1f} s")
    if engine:
        engine.close()
        client.close()
    if world > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
