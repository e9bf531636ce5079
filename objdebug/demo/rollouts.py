"""Rollouts the demo model samples itself (the policy stage's data in `objdebug demo`).

For each of a few held-out demo prompts, G completions are sampled from the demo model (byte
tokens, temperature 2, at most `max_new` tokens, ending at the first newline), and each is rewarded
by its agreement with the demo's correct answer (`reward`): a GRPO group per prompt, written as
`[data] rollouts` JSONL in the ids form (`prompt_ids`, `completion_ids`, `rewards`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from objdebug.demo import corpus, rater

DEMO = Path(__file__).resolve().parent


def sample(model, prompt_ids: list[int], g: int, max_new: int, rng: np.random.Generator,
           temperature: float = 2.0) -> list[list[int]]:
    """G completions of one prompt, sampled from `model` (called on [G, T] int32 ids) at
    `temperature` (above 1: a confident small model still gives a group of different answers),
    each cut at a random length in [2, max_new] (a group of different lengths, as a sampler's
    EOS gives)."""
    import mindspore as ms

    rows = [list(prompt_ids) for _ in range(g)]  # the model has no cache: each step runs the whole row
    done = [False] * g
    for _ in range(max_new):
        ids = ms.Tensor(np.array(rows, np.int32))
        logits = model(ids).asnumpy()[:, -1].astype(np.float64) / temperature
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        for k in range(g):
            tok = int(rng.choice(len(p[k]), p=p[k])) if not done[k] else 0
            rows[k].append(tok)
            done[k] = done[k] or tok == 10  # "\n" ends a demo answer
        if all(done):
            break
    out = []
    for r in rows:
        c = r[len(prompt_ids):][:int(rng.integers(2, max_new + 1))]
        if 10 in c:
            c = c[:c.index(10) + 1]
        out.append([t for t in c] or [10])
    return out


def reward(completion: list[int], good: bytes) -> float:
    """The share of the completion's bytes that equal the correct answer's byte at the same place
    (a dense rule reward in [0, 1]: truncated samples still differ), rounded to 1/100."""
    hits = sum(1 for k, t in enumerate(completion) if k < len(good) and good[k] == t)
    return round(hits / max(len(completion), 1), 2)


def make(path: str | Path, model=None, groups: int = 4, g: int = 4, max_new: int = 14, seed: int = 0) -> Path:
    """Write `groups` groups of `g` sampled, rated completions to `path` (JSONL)."""
    import mindspore as ms

    from objdebug.demo.model import build_model

    if model is None:
        model = build_model()
        ms.load_param_into_net(model, ms.load_checkpoint(str(DEMO / "demo.ckpt")))
        model.set_train(False)
    rng = np.random.default_rng(seed)
    prompts = [json.loads(line)["prompt"] for line in (DEMO / "align.jsonl").read_text().splitlines()[:groups]]
    rows = []
    for i, prompt in enumerate(prompts):
        pid = list(prompt.encode("utf-8"))
        comps = sample(model, pid, g, max_new, rng)
        good = corpus.good_response(rater.parse_prompt(prompt)).encode("utf-8")
        rewards = [reward(c, good) for c in comps]
        rows.append({"id": f"g{i}", "prompt_ids": pid, "completion_ids": comps, "rewards": rewards})
    path = Path(path)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def main(argv=None) -> None:
    """`python -m objdebug.demo.rollouts [OUT]`: the demo's rollouts (objdebug/demo/rollouts.jsonl)."""
    import sys

    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    args = sys.argv[1:] if argv is None else argv
    print(make(args[0] if args else DEMO / "rollouts.jsonl", seed=1, max_new=12))


if __name__ == "__main__":
    main()
