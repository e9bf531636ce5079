"""The allowed values of every profile setting, in one table next to checks/default.toml's defaults.

default.toml gives each key its type (profile.py checks it); this table gives each numeric key its
range and each verdict or choice key its words. A profile is checked against both when it is read,
before any MindSpore work, so a `nan` threshold (every comparison with it is false: a FAIL turns
into a PASS), a negative count or a verdict typo is exit 2 naming the file and the key, never a
run that judged nothing.

A range is written as an interval: `[0, 1]` (closed), `(0, inf)` (open), `[1, inf)`. A float must
lie inside it, so it is finite unless the interval is closed at infinity (`[0, inf]`: only for a
key whose default is itself inf; none is today). An integer key's range bounds the integer; a list
key's range holds for each element; an open table's (`[baseline.tolerances]`) for each value.
tests/test_setting_ranges.py checks that every numeric key of default.toml has a range here, every
string key with a fixed vocabulary its words, and that every shipped profile lies inside them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from objdebug.core.stats import CI_METHODS

SEED = "[0, 4294967295]"   # numpy and MindSpore take a uint32 seed
LENGTH = "[1, 2147483647]"  # a token count reaches MindSpore as an int32 shape
SHARE = "[0, 1]"           # a share of rows / batches / tokens, a probability
TOLERANCE = "[0, inf)"     # a tolerance, an absolute or relative difference: finite, >= 0
RATIO = "[1, inf)"         # largest / smallest, max / mean: >= 1 by construction
CORRELATION = "[-1, 1]"    # Pearson r, a cosine
LEVEL = "(0, 1)"           # a confidence level or a significance
REAL = "(-inf, inf)"       # any finite number (a gap in nats, a logit shift)
VERDICT = ("info", "warn", "fail")

RANGES: dict[str, str | tuple[str, ...]] = {
    "timeout": TOLERANCE,
    "engine.batch_size": "[1, inf)",
    # [align]
    "align.gap_pass": REAL, "align.gap_fail": REAL,
    "align.order_pass": SHARE, "align.order_fail": SHARE,
    # p < p_pass passes and a p-value can be 1: a threshold just above 1 passes every p (the
    # lenient profile of fixtures/targets/reports_tiny: 1.01), so only the sign is bounded
    "align.p_pass": TOLERANCE, "align.p_fail": TOLERANCE,
    "align.min_rows": "[1, inf)", "align.seed": SEED, "align.masked_tolerance": TOLERANCE,
    "align.sanity_samples": "[1, inf)",
    "align.sanity_gap_pass": REAL, "align.sanity_gap_fail": REAL,
    "align.sanity_order_pass": SHARE, "align.sanity_order_fail": SHARE,
    "align.task_order_pass": SHARE, "align.task_order_fail": SHARE,
    "align.task_order_gap": TOLERANCE,
    "grad.class_weight_rtol": TOLERANCE, "grad.ignored_tolerance": TOLERANCE,
    "grad.crf_enum_length": "[1, 8]", "grad.crf_enum_paths": "[1, inf)",
    "grad.crf_nll_tolerance": TOLERANCE, "grad.contrastive_rtol": TOLERANCE,
    # [correlate]
    "correlate.r_pass": CORRELATION, "correlate.r_fail": CORRELATION,
    "correlate.min_samples": "[3, inf)", "correlate.bootstrap_resamples": "[1, inf)",
    "correlate.ci_level": LEVEL, "correlate.ci_method": CI_METHODS, "correlate.seed": SEED,
    "correlate.length_corr_warn": SHARE, "correlate.partial_ratio": TOLERANCE,
    "correlate.aspect_r_warn": CORRELATION,
    # [decompose]
    "decompose.max_samples": "[0, inf)",  # 0: all
    "decompose.dead_warn": SHARE, "decompose.dead_fail": SHARE,
    "decompose.residual_warn": TOLERANCE, "decompose.residual_fail": TOLERANCE,
    "decompose.scale_warn": RATIO, "decompose.scale_fail": RATIO,
    "decompose.grad_batches": "[1, inf)",
    "decompose.value_share_high": SHARE, "decompose.grad_share_low": SHARE,
    "decompose.primary_share_warn": SHARE, "decompose.primary_share_fail": SHARE,
    "decompose.primary_share_target": "(0, 1)",  # the advice divides by it and by 1 - it
    # [preference]
    "preference.max_length": "[0, 2147483647]",  # 0: no cut
    "preference.zero_point_rtol": TOLERANCE, "preference.zero_reward_tolerance": TOLERANCE,
    "preference.flip_tolerance": TOLERANCE, "preference.margin_epsilon": TOLERANCE,
    "preference.step_rel": "(0, inf)", "preference.leak_tolerance": TOLERANCE,
    "preference.length_corr_warn": SHARE, "preference.length_bias": VERDICT,
    "preference.sum_for_mean_loss": VERDICT, "preference.mean_for_summed_loss": VERDICT,
    "preference.setting_rtol": TOLERANCE, "preference.ci_level": LEVEL,
    "preference.low_agreement": VERDICT, "preference.strength_alpha": LEVEL,
    # [policy]
    "policy.zero_loss_tolerance": TOLERANCE, "policy.kl_ratio_tolerance": TOLERANCE,
    "policy.advantage_epsilon": TOLERANCE, "policy.probe_temperature": "(0, inf)",
    "policy.certainty_floor": "[0, 1)", "policy.gradient_floor": "[0, 1)",
    "policy.leak_tolerance": TOLERANCE, "policy.aggregation_rtol": TOLERANCE,
    "policy.pairing_min_share": SHARE, "policy.clip_bisections": "[1, 60]",
    "policy.epsilon_atol": TOLERANCE, "policy.outside_value": REAL,
    "policy.setting_rtol": TOLERANCE, "policy.step_rel": "(0, inf)",
    "policy.old_logp_warn": TOLERANCE, "policy.old_logp_fail": TOLERANCE,
    "policy.old_logp_signature_gain": RATIO, "policy.old_logp_zero_floor": TOLERANCE,
    "policy.old_logp_zero_share": SHARE, "policy.old_logp_argmax_gap": TOLERANCE,
    "policy.old_logp_temperature_rtol": TOLERANCE, "policy.old_logp_min_correlation": CORRELATION,
    "policy.old_logp_tokenizer_gap": TOLERANCE, "policy.old_logp_offset_share": SHARE,
    # [reward]
    "reward.zero_point_rtol": TOLERANCE, "reward.step_rel": "(0, inf)",
    "reward.extra_padding": LENGTH, "reward.padding_rtol": TOLERANCE,
    "reward.last_token_rtol": TOLERANCE, "reward.last_token_fail_share": SHARE,
    "reward.setting_rtol": TOLERANCE, "reward.score_r_pass": CORRELATION,
    "reward.min_samples": "[3, inf)", "reward.bootstrap_resamples": "[1, inf)",
    "reward.ci_level": LEVEL, "reward.seed": SEED,
    # [stress]
    "stress.seed": SEED, "stress.short_length": LENGTH, "stress.long_lengths": LENGTH,
    "stress.long_ratio_warn": RATIO, "stress.long_ratio_fail": RATIO, "stress.long_abs_tolerance": TOLERANCE,
    "stress.memory_safety": "(0, inf)", "stress.memory_calibration_lengths": LENGTH,
    "stress.isolate_above_gib": TOLERANCE,
    "stress.memory_logits_copies": "[0, inf)", "stress.memory_attention_copies": "[0, inf)",
    "stress.memory_activation_copies": "[0, inf)",
    "stress.assume_layers": "[1, inf)", "stress.assume_heads": "[1, inf)",
    "stress.assume_width": "[1, inf)", "stress.assume_vocab": "[1, 2147483647]",
    "stress.objective_long_lengths": LENGTH, "stress.objective_reference_rows": "[1, inf)",
    "stress.all_pad_tolerance": TOLERANCE, "stress.pad_extra": LENGTH,
    "stress.pad_loss_rtol": TOLERANCE, "stress.pad_grad_rtol": TOLERANCE,
    "stress.random_ids_min_ratio": TOLERANCE,
    "stress.label_out_of_range": VERDICT, "stress.input_out_of_range": VERDICT,
    "stress.logit_scales": "(0, inf)", "stress.low_precision_rtol": TOLERANCE,
    "stress.low_precision_forecast": VERDICT,
    "stress.repeat_rtol": TOLERANCE, "stress.batch_samples": "[1, inf)",
    "stress.batch_rtol": TOLERANCE, "stress.batch_fail_rtol": TOLERANCE,
    "stress.top5_min": SHARE, "stress.top_k": "[1, inf)", "stress.smoothing_samples": "[1, inf)",
    "stress.amp_loss_rtol": TOLERANCE, "stress.amp_loss_atol": TOLERANCE,
    "stress.amp_grad_rtol": TOLERANCE,
    # [baseline]
    "baseline.abs_tolerance": TOLERANCE, "baseline.rel_tolerance": TOLERANCE,
    "baseline.regression_verdict": ("warn", "fail"), "baseline.tolerances": TOLERANCE,
    # [monitor]
    "monitor.every": "[1, inf)", "monitor.dead_steps": "[1, inf)",
    "monitor.scale_warn": RATIO, "monitor.scale_fail": RATIO,
    "monitor.ratio_warn": RATIO, "monitor.ratio_fail": RATIO,
    # [grad]
    "grad.mean_norm_pass_low": TOLERANCE, "grad.mean_norm_pass_high": TOLERANCE,
    "grad.mean_norm_fail_low": TOLERANCE, "grad.mean_norm_fail_high": TOLERANCE,
    "grad.kind_reference_factor": RATIO,  # x / reference within [1/f, f]: f >= 1 (1: only an exact match)
    "grad.ratio_pass": RATIO, "grad.ratio_fail": RATIO,
    "grad.leak_tolerance": TOLERANCE, "grad.pad_rel_tolerance": TOLERANCE,
    # the reference ||softmax - onehot|| is a norm of a probability difference; a floor above 1
    # leaves almost no position to judge (1e30: none, and OBJ209 passed on nothing)
    "grad.coverage_zero_floor": SHARE, "grad.coverage_resolve_floor": SHARE,
    "grad.coverage_drop_ratio": SHARE, "grad.coverage_max_period": "[1, inf)",
    "grad.coverage_empty_rows": VERDICT, "grad.coverage_eos_missing": VERDICT,
    "grad.contract_rows": "[1, inf)",
    "grad.scale_pass_low": TOLERANCE, "grad.scale_pass_high": TOLERANCE,
    "grad.scale_fail_low": TOLERANCE, "grad.scale_fail_high": TOLERANCE,
    "grad.n_directions": "[0, inf)",  # the gradient direction is always added
    "grad.seed": SEED, "grad.fd_rel_steps": "(0, inf)", "grad.fd_gradient_steps": "(0, inf)",
    "grad.fd_noise_ulps": TOLERANCE, "grad.fd_pass": TOLERANCE, "grad.fd_fail": TOLERANCE,
    "grad.likelihood_cosine_pass": CORRELATION, "grad.likelihood_cosine_fail": CORRELATION,
    "grad.likelihood_reweighted_pass": SHARE, "grad.likelihood_reweighted_fail": SHARE,
    "grad.likelihood_weight_band": RATIO, "grad.likelihood_max_smoothing": SHARE,
    "grad.likelihood_max_entropy": TOLERANCE, "grad.likelihood_max_zloss": TOLERANCE,
    # [invariants]
    "invariants.label_offsets": "[-2147483648, 2147483647]",
    "invariants.alignment_margin": TOLERANCE, "invariants.logit_shifts": REAL,
    "invariants.rounding_safety": TOLERANCE, "invariants.noise_ulps": TOLERANCE,
    "invariants.logit_shift": VERDICT, "invariants.component_rtol": TOLERANCE,
    "invariants.ignored_rtol": TOLERANCE, "invariants.label_smoothing": "(0, 1)",
    "invariants.seed": SEED, "invariants.upstream_scale": "(0, inf)",
    "invariants.upstream_rtol": TOLERANCE, "invariants.unused_setting": VERDICT,
    "invariants.micro_batches": "[0, inf)",  # 0: one row each
    "invariants.token_weight_tolerance": TOLERANCE, "invariants.token_weighting": VERDICT,
    "invariants.train_eval": VERDICT, "invariants.dropout": VERDICT,
    "invariants.max_length": "[0, 2147483647]",  # 0: not configured
    "invariants.empty_rows": VERDICT,
    # [model_state]
    "model_state.samples": "[1, inf)",
    "model_state.loss_ratio": TOLERANCE, "model_state.entropy_ratio": TOLERANCE,
    # [batches]
    "batches.masked_tolerance": TOLERANCE, "batches.probe_values": "[0, inf)",
    "batches.layout_min_share": SHARE, "batches.empty_rows_fail": SHARE, "batches.report_rows": "[0, inf)",
    # [packing]
    "packing.rows": "[1, inf)", "packing.seed": SEED,
    "packing.isolation_tolerance": TOLERANCE, "packing.gradient_rtol": TOLERANCE,
    "packing.unpacked_tolerance": TOLERANCE, "packing.normalisation_rtol": TOLERANCE,
}


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    low_closed: bool
    high_closed: bool
    text: str

    def __str__(self) -> str:
        """`[0, inf)` reads `>= 0`; a bounded interval as written."""
        if math.isinf(self.high) and not self.high_closed and not math.isinf(self.low):
            return f"{'>=' if self.low_closed else '>'} {self.low:g}"
        return self.text

    def holds(self, value: float) -> bool:
        # nan fails every comparison, so it is outside every interval
        above = value >= self.low if self.low_closed else value > self.low
        below = value <= self.high if self.high_closed else value < self.high
        return above and below


_INTERVAL = re.compile(r"^([\[(])\s*(-?inf|-?[0-9.e+-]+)\s*,\s*(-?inf|-?[0-9.e+-]+)\s*([\])])$")


def interval(text: str) -> Interval:
    m = _INTERVAL.match(text)
    if m is None:
        raise ValueError(f"not an interval: {text!r}")
    return Interval(float(m[2]), float(m[3]), m[1] == "[", m[4] == "]", text)


def problem(dotted: str, value: Any, integer: bool = False) -> str | None:
    """What is wrong with `value` for the profile key `dotted` ("grad.coverage_zero_floor"), as the
    rest of a MindSpore-style sentence ("the value must be a finite number in [0, 1], but got
    nan."); None if it is allowed or the key has no rule (a type mismatch is profile.py's).
    `integer`: default.toml's value is an integer (or a list of them)."""
    rule = RANGES.get(dotted)
    if rule is None:
        return None
    if isinstance(rule, tuple):
        if isinstance(value, str) and value.lower() in rule:
            return None
        return f"the value must be in {list(rule)}, but got {value!r}."
    span = interval(rule)
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None  # the type check says it better
        if not span.holds(v):
            kind = "an integer" if integer else (
                "a number" if span.high_closed and math.isinf(span.high) else "a finite number")
            whose = "each value" if isinstance(value, list) else "the value"
            where = str(span) if str(span)[0] in "<>" else f"in {span}"
            return f"{whose} must be {kind} {where}, but got {v!r}."
    return None


# --------------------------------------------------------------------------- cross-key rules (issue 46)
# Pairs of keys whose values must be ordered: (a, op, b, why). A WARN threshold beyond its FAIL
# threshold, a pass band's lower bound above its upper bound or outside the fail band, a short
# length that is not shorter than the long ones: each makes a verdict impossible or inverted
# without any single key leaving its range. Checked on the merged profile at load (exit 2, one
# line naming both keys and both values); a list value's rule holds for each element.
# tests/test_setting_ranges.py walks every pair, both orders.
ORDERED: tuple[tuple[str, str, str, str], ...] = (
    # higher passes: the pass threshold at or above the fail threshold
    ("align.gap_pass", ">=", "align.gap_fail", "a gap that passes must not fail"),
    ("align.order_pass", ">=", "align.order_fail", "a share that passes must not fail"),
    ("align.sanity_gap_pass", ">=", "align.sanity_gap_fail", "a gap that passes must not fail"),
    ("align.sanity_order_pass", ">=", "align.sanity_order_fail", "a share that passes must not fail"),
    ("grad.likelihood_cosine_pass", ">=", "grad.likelihood_cosine_fail",
     "a cosine that passes must not fail"),
    ("decompose.primary_share_warn", ">=", "decompose.primary_share_fail",
     "a share below the FAIL threshold is below the WARN one too"),
    # lower passes: the pass (or WARN) threshold at or below the fail threshold
    ("align.p_pass", "<=", "align.p_fail", "a p-value that passes must not fail"),
    ("correlate.r_pass", "<=", "correlate.r_fail", "an r that passes must not fail"),
    ("decompose.dead_warn", "<=", "decompose.dead_fail", "the WARN threshold comes before FAIL"),
    ("decompose.residual_warn", "<=", "decompose.residual_fail", "the WARN threshold comes before FAIL"),
    ("decompose.scale_warn", "<=", "decompose.scale_fail", "the WARN threshold comes before FAIL"),
    ("stress.long_ratio_warn", "<=", "stress.long_ratio_fail", "the WARN band holds the FAIL band"),
    ("stress.batch_rtol", "<=", "stress.batch_fail_rtol", "the WARN threshold comes before FAIL"),
    ("monitor.scale_warn", "<=", "monitor.scale_fail", "the WARN threshold comes before FAIL"),
    ("monitor.ratio_warn", "<=", "monitor.ratio_fail", "the WARN threshold comes before FAIL"),
    ("policy.old_logp_warn", "<=", "policy.old_logp_fail", "the WARN threshold comes before FAIL"),
    ("grad.ratio_pass", "<=", "grad.ratio_fail", "a ratio that passes must not fail"),
    ("grad.fd_pass", "<=", "grad.fd_fail", "an error that passes must not fail"),
    ("grad.likelihood_reweighted_pass", "<=", "grad.likelihood_reweighted_fail",
     "a share that passes must not fail"),
    # bands: lower <= upper, and the pass band inside the fail band
    ("grad.mean_norm_pass_low", "<=", "grad.mean_norm_pass_high", "a band's lower bound <= its upper bound"),
    ("grad.mean_norm_fail_low", "<=", "grad.mean_norm_pass_low", "the pass band lies inside the fail band"),
    ("grad.mean_norm_pass_high", "<=", "grad.mean_norm_fail_high", "the pass band lies inside the fail band"),
    ("grad.scale_pass_low", "<=", "grad.scale_pass_high", "a band's lower bound <= its upper bound"),
    ("grad.scale_fail_low", "<=", "grad.scale_pass_low", "the pass band lies inside the fail band"),
    ("grad.scale_pass_high", "<=", "grad.scale_fail_high", "the pass band lies inside the fail band"),
    # lengths: the short reference is shorter than every long input it is compared with
    ("stress.short_length", "<=", "stress.long_lengths",
     "OBJ502 compares each long input with the short one: a long input is not shorter"),
)

_OPS = {"<=": lambda a, b: a <= b, "<": lambda a, b: a < b, ">=": lambda a, b: a >= b}


def _get(data: dict[str, Any], dotted: str) -> Any:
    section, key = dotted.split(".", 1)
    return (data.get(section) or {}).get(key)


def cross_problem(data: dict[str, Any]) -> str | None:
    """The first pair of ORDERED that the merged profile `data` breaks, as one MindSpore-style
    sentence naming both keys and both values; None when every pair holds."""
    for a, op, b, why in ORDERED:
        va, vb = _get(data, a), _get(data, b)
        if va is None or vb is None:
            continue
        for x in (va if isinstance(va, list) else [va]):
            for y in (vb if isinstance(vb, list) else [vb]):
                if isinstance(x, bool) or isinstance(y, bool) or not isinstance(x, (int, float)) \
                        or not isinstance(y, (int, float)) or _OPS[op](x, y):
                    continue
                sa, ka = a.split(".", 1)
                sb, kb = b.split(".", 1)
                return (f"For '[{sa}] {ka}' = {va!r} and '[{sb}] {kb}' = {vb!r}, the first must be "
                        f"{op} the second ({why}), but it is not.")
    return None
