"""Write the demo's evaluation data: ``python -m objdebug.demo.make_data``.

- ``align.jsonl``: 24 held-out prompts (6 per task family), each with a ``good`` (follows every
  rule), ``medium`` (one or two rules broken) and ``bad`` (random splice) response.
- ``scores.jsonl``: 60 other held-out prompts (15 per family), one response each, at five
  quality levels (correct, first draft, two slot errors, many errors, random splice), scored
  1..5 by the rule-based :mod:`objdebug.demo.rater` (which never looks at a model), with
  per-aspect scores under ``"scores"``.
- ``preference.jsonl``: the align prompts as preference pairs for the preference stage: good over
  bad (``strength`` 2), good over medium and medium over bad (``strength`` 1); derived from the
  align rows, so writing it draws nothing from the random generator.

No prompt here is ever trained on (see :func:`objdebug.demo.corpus.split_prompts`).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys

from objdebug.demo import corpus, rater

N_ALIGN_PER_FAMILY = 6
N_SCORES_PER_FAMILY = 15
LEVELS = ("correct", "draft", "two_errors", "many_errors", "random")


def _interleave(groups):
    out = []
    for i in range(max(len(g) for g in groups)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def build(seed=0):
    _, heldout = corpus.split_prompts(seed=seed)
    by_family = [[e for e in heldout if e.family == f] for f in corpus.FAMILIES]
    assert all(len(g) >= N_ALIGN_PER_FAMILY + N_SCORES_PER_FAMILY for g in by_family)
    rng = random.Random(seed + 1)

    align = []
    for i, ex in enumerate(_interleave([g[:N_ALIGN_PER_FAMILY] for g in by_family]), 1):
        medium = corpus.medium_response(ex, rng)
        bad = corpus.bad_response(ex, rng)
        align.append({"id": f"a{i:03d}", "prompt": ex.prompt, "good": ex.good,
                      "medium": medium, "bad": bad})

    scores = []
    score_ex = _interleave([g[N_ALIGN_PER_FAMILY:N_ALIGN_PER_FAMILY + N_SCORES_PER_FAMILY]
                            for g in by_family])
    for i, ex in enumerate(score_ex, 1):
        level = LEVELS[(i - 1) % len(LEVELS)]
        if level == "correct":
            resp = ex.good
        elif level == "draft":
            resp = corpus.medium_response(ex, rng)
        elif level == "two_errors":
            resp = corpus.mutate_response(ex, rng, 2)
        elif level == "many_errors":
            resp = corpus.degrade(ex, rng, 2, break_rule=True)
        else:
            resp = corpus.bad_response(ex, rng)
        r = rater.rate(ex.prompt, resp)
        scores.append({"id": f"s{i:03d}", "prompt": ex.prompt, "response": resp,
                       "score": r["score"],
                       "scores": {"correctness": r["correctness"], "fluency": r["fluency"]}})
    return align, scores


def preference_pairs(align):
    """Pairs (chosen over rejected) from the align rows, with the annotated size of the preference."""
    pairs = []
    for row in align:
        for chosen, rejected, strength in (("good", "bad", 2), ("good", "medium", 1), ("medium", "bad", 1)):
            pairs.append({"id": f"{row['id']}-{chosen}-{rejected}", "prompt": row["prompt"],
                          "chosen": row[chosen], "rejected": row[rejected], "strength": strength})
    return pairs


def _write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    align, scores = build(args.seed)
    _write_jsonl(os.path.join(args.out_dir, "align.jsonl"), align)
    _write_jsonl(os.path.join(args.out_dir, "scores.jsonl"), scores)
    _write_jsonl(os.path.join(args.out_dir, "preference.jsonl"), preference_pairs(align))
    hist = {s: sum(r["score"] == s for r in scores) for s in range(1, 6)}
    print(f"wrote {len(align)} align rows, {3 * len(align)} preference pairs and {len(scores)} score rows to {args.out_dir}; "
          f"score histogram {hist}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
