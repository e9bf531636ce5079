"""Train the task demos' models and write their data (issue 47):
``python -m objdebug.demo.train_tasks --task classification``.

Deterministic (``random``, numpy and ``ms.set_seed``), GRAPH_MODE on CPU, Adam, full batch.
The rows come from the demo corpus (objdebug/demo/corpus.py); held-out prompts are the data
files' rows, never trained on.

- classification: the text ``prompt + good response`` -> its family, imbalanced on purpose
  (owner : count : reverse : shout = 8 : 4 : 2 : 1 in training), trained with
  :class:`objdebug.losses.WeightedCrossEntropy` and the inverse-frequency weights 1 : 2 : 4 : 8
  (`CLASS_WEIGHT`), the setting the class-weight check (OBJ220) measures.
- tagging: the words of ``prompt + good response`` tagged O / NAME / COLOR / ANIMAL / FRUIT, each
  word's tag on its first byte (the other bytes -100, as subword pipelines label pieces), trained
  with the unweighted :class:`objdebug.losses.WeightedCrossEntropy` on `ContextTagger`'s emissions.
- embedding: (prompt, good response) pairs of the training prompts, trained with the in-batch
  :class:`objdebug.losses.InfoNCELoss` (cosine, temperature 0.05) on `BagEncoder`'s embeddings
  (`encoder.ckpt`): the align check (OBJ112) judges the objective on the rows whose positive the
  encoder ranks first, so the encoder must rank some (held-out rows: embedding.jsonl).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile

import numpy as np

from objdebug.demo import corpus

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tasks")
LABELS = ["owner", "count", "reverse", "shout"]
SHARE = {"owner": 8, "count": 4, "reverse": 2, "shout": 1}
CLASS_WEIGHT = [1.0, 2.0, 4.0, 8.0]
SEQ_LEN = 64
PAD_ID = 0


def classification_rows(examples, rng, prefix):
    rows = []
    for i, ex in enumerate(examples):
        rows.append({"id": f"{prefix}{i:03d}", "text": ex.prompt + ex.good,
                     "label": ex.family})
    rng.shuffle(rows)
    return rows


TAGS = ["O", "NAME", "COLOR", "ANIMAL", "FRUIT"]


def word_tag(word: str) -> str:
    base = word.strip(".,!:").lower()
    if base.capitalize() in corpus.NAMES:
        return "NAME"
    if base in corpus.COLORS:
        return "COLOR"
    if base in corpus.ANIMALS or base in [corpus.plural(a) for a in corpus.ANIMALS]:
        return "ANIMAL"
    if base in corpus.FRUITS:
        return "FRUIT"
    return "O"


def tagging_rows(examples, prefix):
    rows = []
    for i, ex in enumerate(examples):
        tokens = (ex.prompt + ex.good).split()
        rows.append({"id": f"{prefix}{i:03d}", "tokens": tokens, "tags": [word_tag(w) for w in tokens]})
    return rows


def tagged_ids(row, ignore=-100):
    """ids and tags as objdebug.engine.tasks reads a `tokens` row (bytes tokenizer)."""
    ids, tags = [], []
    for k, (w, t) in enumerate(zip(row["tokens"], row["tags"])):
        b = corpus.encode((" " if k else "") + w)
        ids += b
        tags += [TAGS.index(t)] + [ignore] * (len(b) - 1)
    return ids, tags


def train_tagger(seed: int, steps: int, out: str, lr: float = 3e-3) -> float:
    import mindspore as ms
    from mindspore import nn, Tensor

    from objdebug.demo.task_models import ContextTagger
    from objdebug.losses import WeightedCrossEntropy

    rng = random.Random(seed)
    train_ex, _ = corpus.split_prompts(seed=seed)
    rng.shuffle(train_ex)
    pairs = [tagged_ids(r) for r in tagging_rows(train_ex[:256], "t")]
    ids = np.full((len(pairs), SEQ_LEN), PAD_ID, np.int32)
    tags = np.full((len(pairs), SEQ_LEN), -100, np.int32)
    for i, (a, b) in enumerate(pairs):
        ids[i, :len(a)] = a[:SEQ_LEN]
        tags[i, :len(b)] = b[:SEQ_LEN]
    model = ContextTagger(tags=len(TAGS))
    step = nn.TrainOneStepCell(nn.WithLossCell(model, WeightedCrossEntropy()),
                               nn.Adam(model.trainable_params(), learning_rate=lr))
    step.set_train()
    loss = float("nan")
    for s in range(steps):
        loss = float(step(Tensor(ids), Tensor(tags)).asnumpy())
        if s % 100 == 0 or s == steps - 1:
            print(f"step {s:4d} loss {loss:.5f}", flush=True)
    ms.save_checkpoint(model, out)
    os.chmod(out, 0o644)
    return loss


def _ids(texts, seq_len=SEQ_LEN):
    out = np.full((len(texts), seq_len), PAD_ID, np.int32)
    for i, t in enumerate(texts):
        b = corpus.encode(t)[:seq_len]
        out[i, :len(b)] = b
    return out


def train_classifier(seed: int, steps: int, out: str, lr: float = 1e-3) -> float:
    import mindspore as ms
    from mindspore import nn, Tensor

    from objdebug.demo.task_models import BagClassifier
    from objdebug.losses import WeightedCrossEntropy

    rng = random.Random(seed)
    train_ex, _ = corpus.split_prompts(seed=seed)
    rows = []
    for fam in LABELS:
        exs = [e for e in train_ex if e.family == fam]
        rng.shuffle(exs)
        rows += [(e.prompt + e.good, LABELS.index(fam)) for e in exs[:16 * SHARE[fam]]]
    ids = Tensor(_ids([r[0] for r in rows]))
    labels = Tensor(np.array([r[1] for r in rows], np.int32))
    model = BagClassifier(classes=len(LABELS))
    step = nn.TrainOneStepCell(nn.WithLossCell(model, WeightedCrossEntropy(weight=CLASS_WEIGHT)),
                               nn.Adam(model.trainable_params(), learning_rate=lr))
    step.set_train()
    loss = float("nan")
    for s in range(steps):
        loss = float(step(ids, labels).asnumpy())
        if s % 100 == 0 or s == steps - 1:
            print(f"step {s:4d} loss {loss:.5f}", flush=True)
    ms.save_checkpoint(model, out)
    os.chmod(out, 0o644)
    return loss


def train_encoder(seed: int, steps: int, out: str, lr: float = 3e-3, batch: int = 128) -> float:
    import mindspore as ms
    from mindspore import nn, Tensor

    from objdebug.demo.task_models import BagEncoder
    from objdebug.losses import InfoNCELoss

    rng = random.Random(seed)
    train_ex, _ = corpus.split_prompts(seed=seed)
    rng.shuffle(train_ex)
    a_all, p_all = _ids([e.prompt for e in train_ex]), _ids([e.good for e in train_ex])
    model = BagEncoder()

    class PairLoss(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.model, self.loss = model, InfoNCELoss(0.05, "cosine")

        def construct(self, a, p):
            return self.loss(self.model(a), self.model(p))

    step = nn.TrainOneStepCell(PairLoss(), nn.Adam(model.trainable_params(), learning_rate=lr))
    step.set_train()
    loss = float("nan")
    for s in range(steps):  # a fresh in-batch draw each step: the negatives vary
        pick = np.asarray(rng.sample(range(len(train_ex)), batch))
        loss = float(step(Tensor(a_all[pick]), Tensor(p_all[pick])).asnumpy())
        if s % 100 == 0 or s == steps - 1:
            print(f"step {s:4d} loss {loss:.5f}", flush=True)
    ms.save_checkpoint(model, out)
    os.chmod(out, 0o644)
    return loss


def write_jsonl(path, rows):
    with open(path, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=["classification", "tagging", "embedding"], default="classification")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    os.makedirs(HERE, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="objdebug-train-")
    old = os.getcwd()
    os.chdir(workdir)  # MindSpore's rank_0/ droppings stay out of the repository
    try:
        import mindspore as ms

        ms.set_context(mode=ms.GRAPH_MODE)
        ms.set_device("CPU")
        ms.set_seed(args.seed)
        np.random.seed(args.seed)
        rng = random.Random(args.seed)
        _, heldout = corpus.split_prompts(seed=args.seed)
        picked = [e for fam in LABELS for e in [x for x in heldout if x.family == fam][:6]]
        if args.task == "classification":
            write_jsonl(os.path.join(HERE, "classification.jsonl"),
                        classification_rows(picked, rng, "c"))
            loss = train_classifier(args.seed, args.steps or 120, os.path.join(HERE, "classifier.ckpt"))
        elif args.task == "embedding":  # embedding.jsonl's held-out rows are kept as they are
            loss = train_encoder(args.seed, args.steps or 400, os.path.join(HERE, "encoder.ckpt"))
        else:
            write_jsonl(os.path.join(HERE, "tagging.jsonl"), tagging_rows(picked[::2], "t"))
            loss = train_tagger(args.seed, args.steps or 60, os.path.join(HERE, "tagger.ckpt"))
    finally:
        os.chdir(old)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"final loss {loss:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
