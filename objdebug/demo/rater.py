"""Rule-based, synthetic rater for the demo corpus.

It never looks at a model. It parses the prompt, rebuilds the one correct response with
:func:`objdebug.demo.corpus.good_response`, and compares the candidate response to it:

- ``correctness`` (content): word-level edit distance ``d`` between the token sequences
  (words and punctuation marks) of the response and the correct response:
  ``d == 0`` -> 5, ``1`` -> 4, ``2`` -> 3, ``d <= len(correct) / 2`` -> 2, otherwise 1.
- ``fluency`` (form): the same distance on *shapes*, where every slot word (a name, color,
  animal, verb, number or fruit, in any inflection or case) is replaced by ``*``, so a response
  that has the family's template with wrong slot words is still fluent.
- ``score`` = ``min(correctness, fluency)``.
"""
from __future__ import annotations

import re

from objdebug.demo import corpus

__all__ = ["parse_prompt", "rate", "tokens"]

_PATTERNS = [
    ("owner", re.compile(r"^(\w+) has a (\w+) (\w+)\.\n?$")),
    ("reverse", re.compile(r"^Reverse: (\w+) (\w+) (\w+)\n?$")),
    ("count", re.compile(r"^Count: (\w+) (\w+), (\w+)\n?$")),
    ("shout", re.compile(r"^Shout: (\w+) (\w+), please\n?$")),
]

_SLOT_WORDS = set()
for _w in (corpus.NAMES + corpus.COLORS + corpus.ANIMALS + corpus.VERBS + corpus.NUMBERS
           + corpus.FRUITS):
    for _v in (_w, _w + "s", corpus.plural(_w)):
        _SLOT_WORDS.update({_v.lower(), _v.upper(), _v.capitalize()})


def parse_prompt(prompt):
    """The :class:`~objdebug.demo.corpus.Example` a prompt was generated from."""
    for family, pat in _PATTERNS:
        m = pat.match(prompt)
        if m:
            return corpus.Example(family, m.groups())
    raise ValueError(f"not a demo-corpus prompt: {prompt!r}")


def tokens(text):
    return re.findall(r"[A-Za-z]+|[^\sA-Za-z]", text)


def _edit_distance(a, b):
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def _grade(d, n):
    if d == 0:
        return 5
    if d == 1:
        return 4
    if d == 2:
        return 3
    if d <= n / 2:
        return 2
    return 1


def rate(prompt, response):
    """``{"score": 1..5, "correctness": 1..5, "fluency": 1..5}`` for a response to a prompt."""
    expected = tokens(corpus.good_response(parse_prompt(prompt)))
    got = tokens(response)
    correctness = _grade(_edit_distance(got, expected), len(expected))

    def shape(toks):
        return ["*" if t in _SLOT_WORDS else t for t in toks]

    fluency = _grade(_edit_distance(shape(got), shape(expected)), len(expected))
    return {"score": min(correctness, fluency), "correctness": correctness, "fluency": fluency}
