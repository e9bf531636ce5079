"""Which label each logit position is scored against, measured on the configured objective.

A causal LM trains logits[t] toward the token at t + 1. Where that shift happens differs between
pipelines: the data pipeline writes the next tokens into the labels (`[data] shift = true`, the
objective pairs logits[t] with labels[t]), or the labels are the input ids and the objective shifts
them itself (`shift = false`: HF's `ForCausalLMLoss` and MindFormers' models score
`logits[:, :-1]` against `labels[:, 1:]`). Every position-wise check (padding leakage, supervision
coverage, the likelihood shape and scale, the long objective, over-smoothing, the model state,
packing) needs the pairing the objective really uses, so it is measured, never assumed:

- one call of the run's own `objective.logit_grad` graph (the dynamic-shape graph the grad stage
  and the invariants share: no compile of its own) on a small [2, 16, V] batch of small random
  logits and random labels, every position supervised, no label equal to a neighbour within two
  positions, pad and ignore ids left out;
- a likelihood objective (cross-entropy, label smoothing, a temperature, a z-loss, focal or MSE on
  probabilities) pushes the logit of the class it trains toward and no other class as hard: at each
  logit position with a gradient, the class with the most negative gradient is the label it is
  scored against. The pairing is the offset d with logits[t] -> labels[t + d] that explains at
  least `AGREEMENT` of those positions.

Offset 0 or 1 is what every stage then pairs by (`paired_labels`). Another clear offset (the HF
loss applied to labels shifted once already: d = 2) is a custom alignment: a note, and the
position-wise checks SKIP with that reason (`custom_reason`); OBJ701 judges the alignment itself
on real text. Where nothing is measured (no logit gradient: an argmax cuts it; non-finite; no
offset agrees) the pairing is what `[data] shift` implies for a correct objective (true: labels[t];
false: labels[t + 1]), and the note says it was not measured.

The end-to-end form (`measure_end_to_end`) is measured the same way at the model's output head,
found inside any Cell: a library model's head from its setup probe (`library_model.py`), or, for a
plain `construct(input_ids, labels)` Cell (a wrapper that owns a model, a loss that owns it), the
Cell tree walked for the first sub-Cell whose vocabulary-wide output the loss reads
(`library_logits.find_head_in`: a Dense / MatMul / `lm_head`); a `HeadProbe` in its place gives
dLoss/dlogits (`library_logits.probe_gradient`), read as above (`library_logits.of_end_to_end`). Only where no head is found is
the pairing what `[data] shift` implies, and the note says why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import mindspore as ms
import numpy as np

from objdebug.engine.gradients import objective_logit_grad

SHAPE = (2, 16)       # rows x positions of the measurement batch (the dynamic graph takes any)
OFFSETS = (0, 1, 2, -1, -2)
AGREEMENT = 0.9       # share of the positions with a gradient one offset must explain
_SEED = 0
INFO_KEY = "label_pairing"


@dataclass(frozen=True)
class Pairing:
    """logits[t] is scored against labels[t + offset]; `measured` False: taken from `[data] shift`."""

    offset: int
    measured: bool
    positions: int = 0                  # logit positions with a gradient in the measurement
    matches: tuple[tuple[int, int], ...] = ()   # (offset, positions it explains)
    why: str = ""                       # why it was not measured, or what was seen

    @property
    def standard(self) -> bool:
        """logits[t] against labels[t] or labels[t + 1]: the position-wise checks can pair."""
        return self.offset in (0, 1)

    def describe(self) -> str:
        """`logits[t] against labels[t+1] (measured: 32 of 32 positions)`."""
        got = f"logits[t] against {label_at(self.offset)}"
        if not self.measured:
            return f"{got} (as data.shift implies; not measured: {self.why})"
        hits = dict(self.matches).get(self.offset, 0)
        if not self.positions:
            return f"{got} (measured by {self.why or 'a probe'})"
        where = f" {self.why}" if self.why else ""
        return f"{got} (measured{where}: {hits} of {self.positions} positions with a logit gradient)"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["matches"] = {str(k): v for k, v in self.matches}
        return d


def label_at(offset: int) -> str:
    return "labels[t]" if offset == 0 else f"labels[t{offset:+d}]"


def declared(shift: bool, why: str) -> Pairing:
    """What a correct objective pairs by, given the labels' layout `[data] shift` states."""
    return Pairing(offset=0 if shift else 1, measured=False, why=why)


def measurement_batch(vocab: int, avoid: set[int], seed: int = _SEED) -> tuple[np.ndarray, np.ndarray]:
    """(logits float32[2, 16, V], labels int32[2, 16]): small random logits, labels drawn from the
    vocabulary less `avoid`, none equal to a label one or two positions away."""
    rng = np.random.default_rng(seed)
    choices = np.array([v for v in range(vocab) if v not in avoid], np.int64)
    b, t = SHAPE
    labels = np.zeros((b, t), np.int64)
    for i in range(b):
        for j in range(t):
            near = set(labels[i, max(0, j - 2):j].tolist())
            pool = choices[~np.isin(choices, list(near))] if near else choices
            labels[i, j] = rng.choice(pool)
    logits = (0.1 * rng.standard_normal((b, t, vocab))).astype(np.float32)
    return logits, labels.astype(np.int32)


def pairing_of_gradient(grad: np.ndarray, labels: np.ndarray) -> tuple[int, tuple[tuple[int, int], ...]]:
    """(positions with a gradient, (offset, positions whose most negative class is labels[t + offset])
    for each offset in OFFSETS), from a logit gradient [B, T, V] on `labels` [B, T]."""
    g = np.asarray(grad, np.float64)
    norm = np.sqrt((g * g).sum(-1))
    live = norm > 1e-7 * max(float(norm.max()), 1e-30)
    target = g.argmin(-1)
    t = labels.shape[1]
    out = []
    for d in OFFSETS:
        hit = 0
        for pos in range(min(t, g.shape[1])):  # a head may drop the last position (MindFormers)
            if 0 <= pos + d < t:
                hit += int((live[:, pos] & (target[:, pos] == labels[:, pos + d])).sum())
        out.append((d, hit))
    return int(live.sum()), tuple(out)


def decide(positions: int, matches: tuple[tuple[int, int], ...], shift: bool) -> Pairing:
    """The pairing the measurement shows (module docstring), or the declared one when it shows none."""
    if positions == 0:
        return declared(shift, "the objective gives no logit gradient on the measurement batch")
    best, hits = max(matches, key=lambda m: (m[1], -abs(m[0] - (0 if shift else 1))))
    if hits < AGREEMENT * positions:
        seen = ", ".join(f"{label_at(d)}: {h}" for d, h in matches if h)
        return declared(shift, f"no offset explains {AGREEMENT:.0%} of the {positions} positions "
                               f"with a logit gradient ({seen or 'none'})")
    return Pairing(offset=best, measured=True, positions=positions, matches=matches)


def measure(engine: Any) -> Pairing:
    """The configured objective's pairing on the measurement batch (split form only)."""
    target = engine.target
    cfg = target.config
    from objdebug.core.config import POLICY_CALLS, PREFERENCE_CALLS, REWARD_CALL

    if cfg.objective.call in PREFERENCE_CALLS + POLICY_CALLS + (REWARD_CALL,):  # no loss(logits, labels)
        return declared(cfg.data.shift, f"[objective] call = \"{cfg.objective.call}\" takes no "
                                        f"(logits, labels)")
    vocab = engine.vocab_size()
    avoid = {int(cfg.data.pad_id), int(cfg.data.label_pad_id)}
    if vocab is None or vocab - len(avoid & set(range(vocab))) < 4:
        return declared(cfg.data.shift, f"a vocabulary of {vocab} classes is too small to tell")
    logits, labels = measurement_batch(vocab, avoid)
    flat = cfg.objective.call == "flat"
    try:
        _, g = objective_logit_grad(engine, target.objective, flat, ms.Tensor(logits, ms.float32),
                                    ms.Tensor(labels, ms.int32), ms.Tensor(np.float32(1.0), ms.float32))
        grad = g.asnumpy()
    except Exception as exc:  # the stages meet the same error in their own calls and report it
        from objdebug.core.crash import first_line

        return declared(cfg.data.shift, f"the objective's logit gradient failed: "
                                        f"{type(exc).__name__}: {first_line(exc)}")
    if not np.isfinite(grad).all():
        return declared(cfg.data.shift, "the objective's logit gradient is not finite")
    positions, matches = pairing_of_gradient(grad, labels)
    return decide(positions, matches, cfg.data.shift)


def of(engine: Any) -> Pairing:
    """The run's pairing, measured once (kept in the target's info, with a note for the report)."""
    target = engine.target
    found = target.info.get(INFO_KEY)
    if found is None:
        found = measure(engine)
        target.info[INFO_KEY] = found
        note = note_of(found, target.config.data.shift)
        if note:
            target.info.setdefault("notes", []).append(note)
    return found


def note_of(p: Pairing, shift: bool) -> str:
    """The target note: said when the objective shifts inside, pairs otherwise, or was not measured."""
    layout = ("data.shift = true: labels[t] is the token after t" if shift
              else "data.shift = false: labels[t] is the token at t")
    if not p.measured:
        return f"the objective scores {p.describe()}; {layout}"
    if not p.standard:
        return (f"the objective scores {p.describe()}: a custom alignment; the position-wise checks "
                f"skip ({layout})")
    if p.offset == 1:
        return f"the objective shifts the labels itself: it scores {p.describe()}; {layout}"
    if not shift:  # labels[t] = token t scored at t: a copy task unless the model shifts (OBJ701)
        return f"the objective does not shift the labels: it scores {p.describe()}; {layout}"
    return ""  # logits[t] against pre-shifted labels[t]: the usual form, nothing to say


def custom_reason(p: Pairing) -> str | None:
    """Why a position-wise check cannot pair logits with labels (None: it can)."""
    if p.standard:
        return None
    return (f"the objective scores {p.describe()}, a custom alignment: which label each logit "
            f"position trains toward is not the pipeline's next token, so the position-wise check "
            f"cannot pair them (OBJ701 judges the alignment)")


def paired_labels(labels: np.ndarray, offset: int, label_pad_id: int, positions: int | None = None) -> np.ndarray:
    """The labels [B, T] aligned with the logit positions [B, positions] (T by default): position t
    holds labels[t + offset], label_pad_id where there is none."""
    positions = labels.shape[1] if positions is None else positions
    out = np.full((labels.shape[0], positions), label_pad_id, labels.dtype)
    src = labels[:, offset:] if offset >= 0 else labels
    start = 0 if offset >= 0 else -offset
    n = max(0, min(positions - start, src.shape[1]))
    out[:, start:start + n] = src[:, :n]
    return out


def labels_for_targets(targets: np.ndarray, offset: int, label_pad_id: int) -> np.ndarray:
    """The inverse of `paired_labels`: labels [B, T] such that logit position t is scored against
    targets[t] (label_pad_id on the positions that pair with no logit)."""
    b, t = targets.shape
    out = np.full((b, t), label_pad_id, targets.dtype)
    if offset >= 0:
        out[:, offset:] = targets[:, :t - offset]
    else:
        out[:, :t + offset] = targets[:, -offset:]
    return out
