"""The bare side of the align benchmarks: what a user writes without objdebug.

    python bench/bare_align.py ROWS.jsonl SPEC.json

Build the model, load the checkpoint, build the objective, then one static graph that runs the
model on [8, T] and calls the objective on each row (`objective(logits[b], labels[b])`, the flat
call the configs name), T the longest row: called on the batches of 8 answers (good / medium / bad
of each prompt, byte tokens, labels shifted: position t scores token t + 1) and once on an
all-masked batch (what align's OBJ105 probe scores). Prints one JSON line.

SPEC.json names what the target's config names, resolved by the caller (bench_align_bare.py,
bench_release.py) so this script imports nothing of objdebug: {"model": "pkg.mod:fn",
"model_kwargs": {}, "objective": "pkg.mod:Cls", "objective_kwargs": {}, "checkpoint": PATH,
"pad_id": 0, "label_pad_id": -100, "paths": [folders the factories import from]}.
"""

import json
import sys
import time

t0 = time.perf_counter()
import importlib  # noqa: E402 - the clock starts before the imports: they are the user's wait too

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import nn, ops  # noqa: E402

B = 8


def factory(spec: str):
    module, _, attr = spec.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def main(rows_path: str, spec_path: str) -> None:
    spec = json.loads(open(spec_path, encoding="utf-8").read())
    sys.path[:0] = spec["paths"]
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    model = factory(spec["model"])(**spec["model_kwargs"])
    ms.load_param_into_net(model, ms.load_checkpoint(spec["checkpoint"]))
    model.set_train(False)
    objective = factory(spec["objective"])(**spec["objective_kwargs"])
    pad, label_pad = spec["pad_id"], spec["label_pad_id"]

    class PerRow(nn.Cell):  # the model, then the objective on each row: each answer's own loss
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.model, self.objective = model, objective

        def construct(self, ids, labels):
            logits = self.model(ids)
            return ops.stack([self.objective(logits[b], labels[b]) for b in range(B)])

    seqs = []
    for line in open(rows_path, encoding="utf-8"):
        row = json.loads(line)
        p = list(row["prompt"].encode())
        for kind in ("good", "medium", "bad"):
            seqs.append((p, list(row[kind].encode())))
    T = max(len(p) + len(r) for p, r in seqs)
    ids = np.full((len(seqs), T), pad, np.int32)
    labels = np.full((len(seqs), T), label_pad, np.int32)
    for i, (p, r) in enumerate(seqs):
        s = p + r
        ids[i, :len(s)] = s
        for t in range(len(p) - 1, len(s) - 1):  # shifted: position t scores token t + 1
            labels[i, t] = s[t + 1]
    cell = PerRow()
    losses = []
    for start in range(0, len(seqs), B):
        chunk_ids, chunk_labels = ids[start:start + B], labels[start:start + B]
        fill = B - len(chunk_ids)
        if fill:
            chunk_ids = np.concatenate([chunk_ids, np.repeat(chunk_ids[:1], fill, 0)])
            chunk_labels = np.concatenate([chunk_labels, np.repeat(chunk_labels[:1], fill, 0)])
        losses += list(cell(ms.Tensor(chunk_ids), ms.Tensor(chunk_labels)).asnumpy()[:B - fill])
    cell(ms.Tensor(np.full((B, T), pad, np.int32)), ms.Tensor(np.full((B, T), label_pad, np.int32))).asnumpy()
    print(json.dumps({"answers": len(losses), "length": T, "batches": -(-len(seqs) // B) + 1, "graphs": 1,
                      "mean_loss": float(np.mean(losses)), "in_script_s": time.perf_counter() - t0}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
