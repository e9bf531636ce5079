"""Train the demo target: ``python -m objdebug.demo.train --out objdebug/demo/demo.ckpt``.

Deterministic (numpy, ``random`` and ``ms.set_seed``), GRAPH_MODE on CPU, Adam, trained on
``prompt + response`` byte sequences with labels = next tokens where prompt and padding
positions are -100 (only the response is scored), using
:class:`objdebug.losses.MaskedCrossEntropy`. Held-out prompts (see
:func:`objdebug.demo.corpus.split_prompts`) are never trained on.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import sys
import tempfile
import time

import numpy as np

from objdebug.demo import corpus

SEQ_LEN = 64            # every training sequence fits (longest is about 55 bytes)
IGNORE = -100
PAD_ID = 0


def make_batch(examples, seq_len=SEQ_LEN):
    """int32 ids [B, T] and labels [B, T]: labels[t] = ids[t+1] on response targets, else -100."""
    ids = np.full((len(examples), seq_len), PAD_ID, dtype=np.int32)
    labels = np.full((len(examples), seq_len), IGNORE, dtype=np.int32)
    for i, (prompt, response) in enumerate(examples):
        p, r = corpus.encode(prompt), corpus.encode(response)
        seq = (p + r)[:seq_len]
        ids[i, :len(seq)] = seq
        # position t predicts token t+1; the response starts at len(p), so the first scored
        # position is len(p) - 1.
        for t in range(len(p) - 1, len(seq) - 1):
            labels[i, t] = seq[t + 1]
    return ids, labels


def lr_schedule(steps, peak, warmup):
    out = []
    for s in range(steps):
        if s < warmup:
            out.append(peak * (s + 1) / warmup)
        else:
            frac = (s - warmup) / max(1, steps - warmup)
            out.append(peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac))))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "demo.ckpt"))
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--n-layers", type=int, default=2)
    ap.add_argument("--n-heads", type=int, default=4)
    args = ap.parse_args(argv)
    out = os.path.abspath(args.out)

    t_start = time.time()
    # MindSpore writes rank_0/ droppings into the working directory on compile errors.
    workdir = tempfile.mkdtemp(prefix="objdebug-train-")
    old_cwd = os.getcwd()
    os.chdir(workdir)
    try:
        import mindspore as ms
        from mindspore import nn, Tensor
        from objdebug.demo.model import build_model
        from objdebug.losses import MaskedCrossEntropy

        ms.set_context(mode=ms.GRAPH_MODE)
        ms.set_device("CPU")
        ms.set_seed(args.seed)
        np.random.seed(args.seed)
        rng = random.Random(args.seed)

        train_ex, heldout = corpus.split_prompts(seed=args.seed)
        by_family = {f: [e for e in train_ex if e.family == f] for f in corpus.FAMILIES}
        print(f"train prompts: {len(train_ex)}  held-out: {len(heldout)}", flush=True)

        model = build_model(vocab_size=256, d_model=args.d_model, n_layers=args.n_layers,
                            n_heads=args.n_heads)

        class WithLoss(nn.Cell):
            def __init__(self, net, loss_fn):
                super().__init__(auto_prefix=False)   # keep the model's parameter names
                self.net = net
                self.loss_fn = loss_fn

            def construct(self, ids, labels):
                logits = self.net(ids)
                return self.loss_fn(logits.reshape((-1, logits.shape[-1])), labels.reshape((-1,)))

        lrs = lr_schedule(args.steps, args.lr, warmup=100)
        opt = nn.Adam(model.trainable_params(), learning_rate=Tensor(np.array(lrs, np.float32)),
                      weight_decay=0.0)
        step = nn.TrainOneStepCell(WithLoss(model, MaskedCrossEntropy(ignore_index=IGNORE)), opt)
        step.set_train()

        fams = list(corpus.FAMILIES)
        ema = None
        for s in range(args.steps):
            batch = []
            for _ in range(args.batch):
                ex = rng.choice(by_family[rng.choice(fams)])
                batch.append((ex.prompt, ex.good))
            ids, labels = make_batch(batch)
            loss = float(step(Tensor(ids), Tensor(labels)).asnumpy())
            ema = loss if ema is None else 0.98 * ema + 0.02 * loss
            if s % 250 == 0 or s == args.steps - 1:
                print(f"step {s:5d}  loss {loss:.4f}  ema {ema:.4f}  "
                      f"{time.time() - t_start:6.1f}s", flush=True)

        os.makedirs(os.path.dirname(out), exist_ok=True)
        ms.save_checkpoint(model, out)
        os.chmod(out, 0o644)   # MindSpore writes checkpoints owner-read-only (0400)
    finally:
        os.chdir(old_cwd)
        shutil.rmtree(workdir, ignore_errors=True)
    wall = time.time() - t_start
    print(f"final train loss {loss:.4f} (ema {ema:.4f}); wall time {wall:.1f}s; "
          f"saved {out} ({os.path.getsize(out)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
