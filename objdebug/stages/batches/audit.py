"""The batches stage's one measurement, shared by its checks and by `objdebug batches --show`.

The batches are read once per run (`real_batches`: `[data] batches`, at most `max_batches`),
their layout read from the batches themselves (`layout.py`), and every label value that masks a
position (on padding, or on a real token whose label does not follow the inputs), the declared
`label_pad_id` and -100 are probed on the real objective in graph mode: the engine's masked probe
(OBJ105's, `Engine.masked_probe`) on rows labelled only with that value. A loss of 0 (or NaN,
0/0) means the objective ignores the value; a loss means it trains toward it; an error (GatherD
out of range) means it rejects it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from objdebug.pipeline.pipeline_batches import real_batches
from objdebug.report.batch_rows import IGNORED, PADDING, TRAINED, WRONG  # the classes, shared with the reports
from objdebug.stages.batches.layout import (BatchLayout, Reading, follows, layout_name, layout_of,
                                            masking_values, read_offset)

COMMON_IGNORE_INDEX = -100  # PyTorch's and MindSpore's CrossEntropyLoss default


def no_label_objective(ctx: Any) -> str | None:
    """Why no check can probe `loss(logits, labels)` on this target (a preference call takes
    log-probs or pairs, not labels), or None. The batches stage still runs: its checks that read
    only the batches (layout, conventions, attention mask, vocabulary, the pair checks) judge
    them; those that ask the objective which label values it ignores skip, saying this."""
    from objdebug.core.config import POLICY_CALLS, PREFERENCE_CALLS, REWARD_CALL

    call = ctx.config.objective.call
    takes = ("preference pairs" if call in PREFERENCE_CALLS else "policy rollouts" if call in POLICY_CALLS
             else "a reward model's rewards" if call == REWARD_CALL else None)
    if takes is None:
        return None
    besides = (" (the pair checks OBJ030-OBJ035 judge these batches; put a cross-entropy [objective] "
               "beside a [preference] section to run this check too)" if call in PREFERENCE_CALLS else "")
    return (f"[objective] call = \"{call}\": the objective takes {takes}, not (logits, labels), so "
            f"which label values it ignores cannot be probed{besides}")


def has_labels(ctx: Any) -> bool:
    return any(b.labels is not None for b in real_batches(ctx).batches)


@dataclass
class Probe:
    value: int
    loss: float
    rejected: str | None = None  # the error the objective raised on this value
    tolerance: float = 0.0       # |loss| at most this: ignored

    @property
    def ignored(self) -> bool:
        return self.rejected is None and (math.isnan(self.loss) or abs(self.loss) <= self.tolerance)


@dataclass
class Audit:
    source: str
    layouts: list[BatchLayout]
    pad_id: int | None               # the id the batches pad with (measured)
    side: str | None                 # where they pad (measured)
    layout: str | None               # layout_name(offset): UNSHIFTED / PRE_SHIFTED / "shifted +2" /
                                     # UNCLEAR; None without labels
    reading: Reading                 # the measured offset d (labels[t] == input_ids[t + d]), shares
    counted: int                     # labelled real-token positions the layout was read from
    on_pad: Counter                  # label value -> positions, on padding
    on_real: Counter                 # label value -> positions, on real tokens not following the inputs
    vocab: int | None = None
    prober: Any = None               # () -> {value: Probe}: the probes, run when first read
    _probes: dict[int, Probe] | None = None

    @property
    def probes(self) -> dict[int, Probe]:
        """Each masking value probed on the objective (compiled once, when a check first reads
        them: OBJ013 / OBJ019 never do)."""
        if self._probes is None:
            self._probes = self.prober() if self.prober is not None else {}
        return self._probes

    @property
    def offset(self) -> int | None:
        """The measured offset d (None: none clear, or no labels)."""
        return self.reading.offset

    def ignored(self) -> list[int]:
        return sorted(v for v, p in self.probes.items() if p.ignored)

    def classes(self, lay: BatchLayout) -> np.ndarray:
        """Each position's class: TRAINED / IGNORED / PADDING / WRONG (a label the objective
        trains on where nothing should be learned: on padding, or on a real token whose label is
        neither the paired input token nor an ignored value, or outside the vocabulary)."""
        out = np.full(lay.padding.shape, TRAINED, dtype=object)
        labels = lay.batch.labels
        if labels is None:
            out[lay.padding] = PADDING
            return out
        ign = np.isin(labels, self.ignored())
        inside = (labels >= 0) & (labels < self.vocab) if self.vocab else labels >= 0
        out[~lay.padding & ign] = IGNORED
        out[~lay.padding & ~ign & ~(follows(lay, self.offset) & inside)] = WRONG
        out[lay.padding & ign] = PADDING
        out[lay.padding & ~ign] = WRONG
        return out


def audit(ctx: Any, th: Any) -> Audit:
    """The shared measurement (built once per run)."""
    return ctx.provide(audit, lambda: _measure(ctx, th))


def _measure(ctx: Any, th: Any) -> Audit:
    d = ctx.config.data
    got = real_batches(ctx)
    layouts = [layout_of(b, d.pad_id, d.eos_id) for b in got.batches]
    pads = Counter(lay.pad_id for lay in layouts if lay.pad_id is not None)
    sides = Counter(lay.side for lay in layouts if lay.side is not None)
    reading = read_offset(layouts, float(th["layout_min_share"]))
    layout = layout_name(reading.offset) if reading.counted else None
    on_pad, on_real = masking_values(layouts, reading.offset)
    result = Audit(got.source, layouts, pads.most_common(1)[0][0] if pads else None,
                   sides.most_common(1)[0][0] if sides else None, layout, reading, reading.counted,
                   on_pad, on_real, vocab=ctx.engine.vocab_size())
    if got.batches and any(b.labels is not None for b in got.batches) and no_label_objective(ctx) is None:
        values = [v for v, _ in (on_pad + on_real).most_common(int(th["probe_values"]))]
        tolerance = float(th["masked_tolerance"])
        result.prober = lambda: {value: probe(ctx, value, tolerance) for value in
                                 dict.fromkeys(values + [d.label_pad_id, COMMON_IGNORE_INDEX])}
    return result


def probe(ctx: Any, value: int, tolerance: float) -> Probe:
    """The real objective on rows labelled only with `value` (one shared per-sample graph)."""
    from objdebug.engine.compile_errors import compile_error

    # at the contract probe's length when it ran: its per-sample graph is reused, no compile
    length = (getattr(ctx.target, "info", None) or {}).get("contract", {}).get("length")
    try:
        loss = float(ctx.engine.masked_probe(length, label=value)[0])
    except Exception as exc:  # e.g. GatherD: the value is out of range for the objective
        if compile_error(exc) is not None:  # a graph that does not compile is not an answer
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        return Probe(value, float("nan"), f"{type(exc).__name__}: {first}", tolerance)
    return Probe(value, loss, None, tolerance)
