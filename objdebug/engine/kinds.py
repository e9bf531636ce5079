"""What each `[task] kind` has: its labels, the ignored label, the stress cases (issue 55).

One table, read by planning (`Check.kinds` of the checks that depend on a trait are built from
it) and by the measurements (which all-padding case a kind has), so no stage asks `kind ==` for
these questions. The causal LM's conventions are its own: a causal LM and a tagger see
`label_pad_id` on every row (padding, the prompt, the word pieces after a token's first), a
sequence classifier never does (every row has a class of `[task] labels`; `engine/tasks.py`
refuses anything else), an embedding row has no label at all.

| kind | label | ignored label | all-padding case (OBJ503) |
|---|---|---|---|
| causal-lm | per token | always (padding, prompt) | every label ignored: the loss is 0 |
| classification | per row | only when the objective declares an `ignore_index` | an all-padding *input* with a real label: finite |
| tagging | per token | always (padding, later word pieces) | every tag ignored: the loss is 0 (a CRF layer called with a mask: an all-padding input with real tags, finite) |
| embedding | none | none | every text all padding: finite |
"""

from __future__ import annotations

from dataclasses import dataclass

# where the kind's rows carry `label_pad_id`
ALWAYS, DECLARED, NEVER = "always", "declared", "never"
# the all-padding batch of a kind: every label ignored (the loss must be 0), or an input of
# padding only with the rows' real labels / texts (finiteness is what is judged)
IGNORED_LABELS, PADDING_INPUT, EMPTY_TEXTS = "ignored-labels", "padding-input", "empty-texts"

# the objective's settings that name the label it ignores (kwargs or Cell attributes)
IGNORE_KEYS = ("ignore_index", "ignore_label", "label_pad_id")


@dataclass(frozen=True)
class Kind:
    """One `[task] kind`: `label` ("token", "row" or None), where its rows carry the ignored
    label (`ignored`), and its all-padding stress case (`all_padding`)."""

    name: str
    label: str | None
    ignored: str
    all_padding: str


TABLE = {k.name: k for k in (
    Kind("causal-lm", "token", ALWAYS, IGNORED_LABELS),
    Kind("classification", "row", DECLARED, PADDING_INPUT),
    Kind("tagging", "token", ALWAYS, IGNORED_LABELS),
    Kind("embedding", None, NEVER, EMPTY_TEXTS),
)}
NAMES = tuple(TABLE)


def of(kind: str) -> Kind:
    return TABLE[kind]


def labelled() -> tuple[str, ...]:
    """The kinds whose rows carry labels the objective reads (not the causal LM: its own checks)."""
    return tuple(k.name for k in TABLE.values() if k.label is not None and k.name != "causal-lm")


def tasks() -> tuple[str, ...]:
    """Every kind but the causal LM (whose checks are the rest of objdebug)."""
    return tuple(k for k in TABLE if k != "causal-lm")


def unlabelled() -> tuple[str, ...]:
    """The kinds whose rows carry no label (embedding: pairs or triplets of texts)."""
    return tuple(k.name for k in TABLE.values() if k.label is None)


def per_token() -> tuple[str, ...]:
    """The kinds (not the causal LM) with one label per token (tagging: a CRF's kind)."""
    return tuple(k.name for k in TABLE.values() if k.label == "token" and k.name != "causal-lm")


def with_ignored_label() -> tuple[str, ...]:
    """The kinds (not the causal LM) whose rows may carry `label_pad_id` (always or when declared)."""
    return tuple(k.name for k in TABLE.values() if k.ignored != NEVER and k.name != "causal-lm")


def declared_ignore_index(cfg, objective) -> tuple[object, str] | tuple[None, str]:
    """(the label the objective says it ignores, where it was read): its kwargs, else its Cell's
    attribute (`ignore_index`, ...); (None, "") when it names none."""
    for key in IGNORE_KEYS:
        if cfg.objective.kwargs.get(key) is not None:
            return cfg.objective.kwargs[key], f"objective.kwargs.{key}"
    for key in IGNORE_KEYS:
        value = getattr(objective, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value, f"{type(objective).__name__}.{key}"
    return None, ""


def ignores_labels(cfg, objective) -> tuple[bool, str]:
    """(whether the kind's batches carry ignored labels for this objective, why): always for a
    causal LM and a tagger; for a classifier only when the objective declares an ignore_index."""
    kind = of(cfg.task.kind)
    if kind.ignored == ALWAYS:
        return True, f"a {kind.name} batch carries label_pad_id on the positions it does not score"
    if kind.ignored == NEVER:
        return False, f"a {kind.name} row has no label"
    value, where = declared_ignore_index(cfg, objective)
    if value is None:
        return False, (f"a {kind.name} row always has a class of the list (no row is ignored) and "
                       f"the objective declares no ignore_index")
    return True, f"the objective declares {where} = {value}"


def all_padding_case(cfg, objective) -> str:
    """The kind's all-padding batch (OBJ503): every label ignored where the kind's batches carry
    ignored labels for this objective (a classifier's objective that declares an ignore_index
    included), else its own case (an all-padding input with the rows' real labels, empty texts)."""
    kind = of(cfg.task.kind)
    if getattr(type(objective), "MASK_ADAPTER", False):
        # a CRF layer called with a mask gets a prefix mask whose first position is on
        # (engine/tasks.py `with_mask`; pytorch-crf raises on any other): a row with no scored
        # tag is not a batch it can be given, an input of padding with real tags is
        return PADDING_INPUT
    if kind.label is not None and ignores_labels(cfg, objective)[0]:
        return IGNORED_LABELS
    return kind.all_padding
