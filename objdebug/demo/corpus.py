"""Rule-generated prompt/response corpus of the demo target.

Everything here is synthetic and deterministic given a seed. There are four task families; each
prompt has exactly one correct ("good") response, defined by the family's rules:

``owner``    ``"Ana has a red cat.\\n"``            -> ``"The cat of Ana is red."``
``reverse``  ``"Reverse: plum fig kiwi\\n"``         -> ``"kiwi, fig, plum."``
``count``    ``"Count: three fox, run\\n"``          -> ``"I see three foxes that run."``
             ``"Count: one fox, run\\n"``            -> ``"I see one fox that runs."``
``shout``    ``"Shout: red plum, please\\n"``        -> ``"RED PLUM, PLEASE!"``

Grammar rules of ``count``: the noun is singular after ``one`` and plural otherwise (``-es`` after
x, else ``-s``); the verb takes ``-s`` only with a singular noun.

For a prompt, :func:`medium_response` is a plausible "first draft" that breaks one or two rules
(a wrong slot word, a wrong agreement, one word left lowercase, two words swapped) and
:func:`bad_response` is a random splice of words taken from anywhere in the corpus.

Prompts end with a newline; a training sequence is the bytes of ``prompt + response``.
"""
from __future__ import annotations

import itertools
import random

__all__ = [
    "NAMES", "COLORS", "ANIMALS", "VERBS", "NUMBERS", "FRUITS", "FAMILIES", "WORD_POOL",
    "Example", "all_prompts", "split_prompts", "good_response", "medium_response",
    "bad_response", "mutate_response", "degrade", "encode",
]

NAMES = ["Ana", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jade", "Kim", "Leo"]
COLORS = ["red", "blue", "green", "black", "white", "brown", "pink", "gray"]
ANIMALS = ["cat", "dog", "fox", "owl", "hen", "pig", "cow", "bee", "yak", "eel"]
VERBS = ["run", "jump", "sleep", "swim", "sing", "eat", "hide", "play"]
NUMBERS = ["one", "two", "three", "four", "five", "six"]
FRUITS = ["apple", "pear", "plum", "lime", "fig", "kiwi", "melon", "grape", "lemon", "peach"]
FAMILIES = ("owner", "reverse", "count", "shout")

# Every word that appears in some response; the source of "random splice" bad responses.
WORD_POOL = sorted(set(
    NAMES + COLORS + ANIMALS + VERBS + NUMBERS + FRUITS
    + ["The", "of", "is", "I", "see", "that", "please"]
    + [a + "s" for a in ANIMALS] + [v + "s" for v in VERBS]
    + [w.upper() for w in COLORS + FRUITS]
))


class Example(tuple):
    """``(family, slots)``; ``slots`` is a tuple of slot words. Hashable, so it can be split."""

    __slots__ = ()

    def __new__(cls, family, slots):
        return super().__new__(cls, (family, tuple(slots)))

    @property
    def family(self):
        return self[0]

    @property
    def slots(self):
        return self[1]

    @property
    def prompt(self):
        return prompt_text(self)

    @property
    def good(self):
        return good_response(self)


def plural(noun):
    return noun + ("es" if noun.endswith("x") else "s")


def prompt_text(ex):
    s = ex.slots
    if ex.family == "owner":
        return f"{s[0]} has a {s[1]} {s[2]}.\n"
    if ex.family == "reverse":
        return f"Reverse: {s[0]} {s[1]} {s[2]}\n"
    if ex.family == "count":
        return f"Count: {s[0]} {s[1]}, {s[2]}\n"
    if ex.family == "shout":
        return f"Shout: {s[0]} {s[1]}, please\n"
    raise ValueError(f"unknown family {ex.family!r}")


def _count_words(number, animal, verb):
    if number == "one":
        return number, animal, verb + "s"
    return number, plural(animal), verb


def good_response(ex):
    """The unique response that follows every rule of the example's family."""
    s = ex.slots
    if ex.family == "owner":
        name, color, animal = s
        return f"The {animal} of {name} is {color}."
    if ex.family == "reverse":
        return f"{s[2]}, {s[1]}, {s[0]}."
    if ex.family == "count":
        n, a, v = _count_words(*s)
        return f"I see {n} {a} that {v}."
    if ex.family == "shout":
        return f"{s[0].upper()} {s[1].upper()}, PLEASE!"
    raise ValueError(f"unknown family {ex.family!r}")


def all_prompts():
    """Every example of every family, in a fixed order."""
    out = []
    for name, color, animal in itertools.product(NAMES, COLORS, ANIMALS):
        out.append(Example("owner", (name, color, animal)))
    for f in itertools.permutations(FRUITS, 3):
        out.append(Example("reverse", f))
    for n, a, v in itertools.product(NUMBERS, ANIMALS, VERBS):
        out.append(Example("count", (n, a, v)))
    for c, f in itertools.product(COLORS, FRUITS):
        out.append(Example("shout", (c, f)))
    return out


def split_prompts(seed=0, n_heldout_per_family=21):
    """Deterministic (train, heldout) split of :func:`all_prompts`; held-out prompts never
    appear in training. Held-out examples come in the family order of ``FAMILIES``."""
    rng = random.Random(seed)
    train, heldout = [], []
    for fam in FAMILIES:
        exs = [e for e in all_prompts() if e.family == fam]
        rng.shuffle(exs)
        heldout.extend(exs[:n_heldout_per_family])
        train.extend(exs[n_heldout_per_family:])
    return train, heldout


def _other(rng, pool, current):
    return rng.choice([w for w in pool if w != current])


def _mutate_slots_once(ex, rng):
    """A copy of ``ex`` with one slot word swapped for another word of the same kind."""
    s = list(ex.slots)
    if ex.family == "owner":
        i = rng.randrange(3)
        s[i] = _other(rng, (NAMES, COLORS, ANIMALS)[i], s[i])
    elif ex.family == "reverse":
        i = rng.randrange(3)
        s[i] = _other(rng, [f for f in FRUITS if f not in s], s[i])
    elif ex.family == "count":
        i = rng.randrange(1, 3)          # animal or verb; number changes agreement too
        s[i] = _other(rng, (NUMBERS, ANIMALS, VERBS)[i], s[i])
    elif ex.family == "shout":
        i = rng.randrange(2)
        s[i] = _other(rng, (COLORS, FRUITS)[i], s[i])
    return Example(ex.family, s)


def _break_rule(ex, rng):
    """The good response with one family-specific rule broken (not a slot substitution)."""
    s = ex.slots
    if ex.family == "owner":               # roles swapped: color and animal exchanged
        name, color, animal = s
        return f"The {color} of {name} is {animal}."
    if ex.family == "reverse":             # list not reversed
        return f"{s[0]}, {s[1]}, {s[2]}."
    if ex.family == "count":               # agreement broken
        n, a, v = _count_words(*s)
        if rng.random() < 0.5:
            a = s[1] if n != "one" else plural(s[1])
        else:
            v = s[2] if n == "one" else s[2] + "s"
        return f"I see {n} {a} that {v}."
    if ex.family == "shout":               # one word left lowercase
        if rng.random() < 0.5:
            return f"{s[0]} {s[1].upper()}, PLEASE!"
        return f"{s[0].upper()} {s[1]}, PLEASE!"
    raise ValueError(ex.family)


def medium_response(ex, rng):
    """A plausible first draft: one or two rules broken (wrong slot word or broken rule)."""
    r = rng.random()
    if r < 0.45:
        return good_response(_mutate_slots_once(ex, rng))
    if r < 0.8:
        return _break_rule(ex, rng)
    # two errors: a wrong slot word and a broken rule
    return _break_rule(_mutate_slots_once(ex, rng), rng)


def mutate_response(ex, rng, n_errors):
    """A response with about ``n_errors`` word-level errors (slot substitutions), built on the
    correct template; used for the graded ``scores.jsonl`` rows."""
    cur = ex
    for _ in range(n_errors):
        cur = _mutate_slots_once(cur, rng)
    return good_response(cur)


def degrade(ex, rng, n_slot_errors, break_rule=False):
    """The correct template with ``n_slot_errors`` slot substitutions and, optionally, one
    family rule broken as well; the "many errors" level of ``scores.jsonl``."""
    cur = ex
    for _ in range(n_slot_errors):
        cur = _mutate_slots_once(cur, rng)
    return _break_rule(cur, rng) if break_rule else good_response(cur)


def bad_response(ex, rng, min_len=12, max_len=48):
    """A random splice: words drawn from the whole corpus, unrelated to the prompt."""
    good = good_response(ex)
    target = max(min_len, min(max_len, len(good) + rng.randint(-4, 4)))
    words = []
    while len(" ".join(words)) < target:
        words.append(rng.choice(WORD_POOL))
    text = " ".join(words)
    if rng.random() < 0.5:
        text += "."
    return text[:60]


def encode(text):
    """Byte-level tokenizer of the demo: UTF-8 bytes, vocabulary 256, pad id 0."""
    return list(text.encode("utf-8"))
