"""`[data] rollouts`: groups of sampled completions with their rewards (the policy stage's data).

One JSONL row per group: `{"id", "prompt", "completions": [..], "rewards": [..]}` (text, through
the tokenizer, `[data] eos_id` appended to each completion) or `"prompt_ids"`, `"completion_ids":
[[..], ..]` (used as written: its EOS, if any, included); optional `"old_logps"`: per completion
token, the log-probs a stale policy gave them (the user's buffer). Every error names file and line
(exit 2): a group of one completion (no group baseline), rewards that are not finite numbers, a
token id outside the model's vocabulary (naming the completion), a
completion longer than the model's positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from objdebug.core.errors import InputError
from objdebug.engine.data import read_jsonl


@dataclass
class Completion:
    group: int            # index of its group
    group_id: str
    index: int            # its place in the group
    prompt: list[int]
    completion: list[int]
    reward: float
    old_logps: list[float] | None

    @property
    def length(self) -> int:
        return len(self.prompt) + len(self.completion)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(float(x))


def read_rollouts(path: str, encoder: Any, eos_id: int | None, max_length: int | None,
                  limit_source: str = "the model's position limit") -> list[list[Completion]]:
    """Groups of completions from `path` (see the module docstring); InputError naming file:line."""
    groups: list[list[Completion]] = []
    seen: set[str] = set()
    named = replace(encoder, source=str(path))  # the encoder's own errors name this file
    bare = replace(encoder, source=None)         # ... or say which completion, named here
    for lineno, row in read_jsonl(path, "rollouts"):
        def bad(message: str) -> InputError:
            return InputError(message, source=str(path), line=lineno)

        gid = str(row.get("id", f"line{lineno}"))
        if gid in seen:
            raise bad(f"duplicate id '{gid}'")
        seen.add(gid)
        prompt = named.field(row, "prompt", lineno, required=False) or []
        if "completion_ids" in row and "completions" in row:
            raise bad("the row has both 'completions' and 'completion_ids'; keep one (text or token ids)")
        if "completion_ids" in row:
            raw = row["completion_ids"]
            if not isinstance(raw, list) or not all(isinstance(c, list) for c in raw):
                raise bad("field 'completion_ids' must be a list of lists of integers (one per completion)")
            comps = []
            for k, c in enumerate(raw):
                try:
                    comps.append(bare.field({"completion_ids": c}, "completion", lineno))
                except InputError as err:
                    raise bad(f"completion {k} of group '{gid}': {err}") from None
        elif "completions" in row:
            raw = row["completions"]
            if not isinstance(raw, list) or not all(isinstance(c, str) for c in raw):
                raise bad("field 'completions' must be a list of strings (one per completion)")
            comps = []
            for k, c in enumerate(raw):
                try:
                    comps.append(bare.field({"completion": c}, "completion", lineno)
                                 + ([eos_id] if eos_id is not None else []))
                except InputError as err:
                    raise bad(f"completion {k} of group '{gid}': {err}") from None
        else:
            raise bad("missing field 'completions' (or 'completion_ids')")
        if len(comps) < 2:
            raise bad(f"a group needs at least 2 completions of its prompt (the group baseline of "
                      f"its advantages), but got {len(comps)}")
        rewards = row.get("rewards")
        if not isinstance(rewards, list) or not all(_number(r) for r in rewards):
            shown = rewards if not isinstance(rewards, list) else next(r for r in rewards if not _number(r))
            raise bad(f"field 'rewards' must be a list of finite numbers, one per completion, but got "
                      f"{shown!r}")
        if len(rewards) != len(comps):
            raise bad(f"field 'rewards' has {len(rewards)} values for {len(comps)} completions")
        olds = row.get("old_logps")
        if olds is not None:
            ok = isinstance(olds, list) and len(olds) == len(comps) and all(
                isinstance(o, list) and len(o) == len(c) and all(_number(v) and v <= 0 for v in o)
                for o, c in zip(olds, comps))
            if not ok:
                raise bad("field 'old_logps' must hold, per completion, one finite log-prob <= 0 per "
                          "completion token")
        group = []
        for k, (c, r) in enumerate(zip(comps, rewards)):
            item = Completion(len(groups), gid, k, list(prompt), list(c), float(r),
                              None if olds is None else [float(v) for v in olds[k]])
            if max_length and item.length > max_length:
                raise bad(f"completion {k} of group '{gid}' makes {item.length} tokens with its prompt, "
                          f"more than the model's {max_length} positions ({limit_source})")
            group.append(item)
        groups.append(group)
    return groups


def group_advantages(rewards: np.ndarray, how: str, fn: Any = None) -> np.ndarray:
    """float64[groups, G] rewards -> advantages: "std" ((r - mean) / (std + 1e-4) per group, GRPO,
    the population std as TRL), "mean" (r - mean, Dr. GRPO) or the user's function `fn` (its
    result taken as float64). A reference of the two built-in forms, used to make the inputs."""
    r = np.asarray(rewards, np.float64)
    if fn is not None:
        return np.asarray(fn(r), np.float64)
    centred = r - r.mean(axis=1, keepdims=True)
    if how == "mean":
        return centred
    return centred / (r.std(axis=1, keepdims=True) + 1e-4)
