"""Is the model trained at all? One measurement per run, shared by every check that needs to know.

Quality checks (align ordering and gap, correlation with people, over-smoothing, the synthesized
sanity check) judge what the model has learned through the objective. On a freshly initialised
model they all fail, and none of those failures is a bug in the objective. So before such a check
reports a WARN or FAIL, it asks here; when the model is untrained the finding becomes a note
(INFO) that says why, with the measured numbers.

"Untrained" is measured, not assumed: on the first `[model_state] samples` of the target's data,
the model's mean per-token cross-entropy of the real next tokens is close to log V (chance) and
the mean entropy of its predicted distribution is close to log V (flat). Both come from the
engine's existing logits graph (the same shapes as the other stages use: no extra compile for a
bucket another stage scores) and are computed in numpy float64 — a reference measurement of the
MODEL, never a verdict on the user's objective. In the end-to-end form (no logits) the loss is
the objective's own per-sample value and there is no entropy.

The measurement is lazy (made the first time a check asks) and cached on the Context; the run
reports it once, as the pipeline-level finding OBJ004 at the top of the report.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from objdebug.pipeline.context import Context
from objdebug.core.findings import CheckResult, Finding, Verdict
from objdebug.report import describe_model_state as describe
from objdebug.rules import get_rule

STAGE = "model"
CHECK = "model-state"
CODE = "OBJ004"


def settings(ctx: Context) -> dict[str, Any]:
    return ctx.profile.section("model_state")


def detection_on(ctx: Context) -> bool:
    """False when the user said the model is trained: `--expect-trained` or the profile key."""
    if ctx.options.expect_trained:
        return False
    return not bool(settings(ctx)["expect_trained"])


def _from_logits(ctx: Context, samples: list) -> dict[str, Any]:
    """Mean cross-entropy of the real next tokens and mean predictive entropy, float64, over the
    scored positions (label != label_pad_id), batched per length bucket like every other stage."""
    from objdebug.pipeline.run_data import logits_of_rows

    cfg = ctx.config.data
    ce_sum, ent_sum, count = 0.0, 0.0, 0
    for x, labels in logits_of_rows(ctx, samples):
        y = labels.astype(np.int64)  # at t the token after t (logits_of_rows)
        keep = y != cfg.label_pad_id
        x, y = x[keep], y[keep]
        if not y.size:
            continue
        x = x - x.max(-1, keepdims=True)
        logz = np.log(np.exp(x).sum(-1))
        logp = x - logz[:, None]
        ce_sum += float(-(logp[np.arange(y.size), y]).sum())
        ent_sum += float(-(np.exp(logp) * logp).sum())
        count += int(y.size)
    if not count:
        return {"positions": 0, "loss": float("nan"), "entropy": float("nan")}
    return {"positions": count, "loss": ce_sum / count, "entropy": ent_sum / count}


def measure(ctx: Context) -> dict[str, Any]:
    """The measurement itself (uncached): loss, entropy, log V and the verdict 'untrained'."""
    from objdebug.pipeline.datasets import text_samples

    th = settings(ctx)
    n = int(th["samples"])
    loss_ratio, entropy_ratio = float(th["loss_ratio"]), float(th["entropy_ratio"])
    samples = text_samples(ctx, n)
    vocab = ctx.engine.vocab_size()
    if not vocab:
        return {"measured": False, "reason": "the vocabulary size is unknown (end-to-end form without "
                                             "data.vocab_size)"}
    if ctx.target.end_to_end:
        values = ctx.engine.evaluate(samples, label="model state: scoring text")[:, 0]
        loss, entropy, positions, source = float(np.mean(values)), None, None, "objective"
    else:
        m = _from_logits(ctx, samples)
        loss, entropy, positions, source = m["loss"], m["entropy"], m["positions"], "logits"
    log_v = math.log(vocab)
    loss_r = loss / log_v
    ent_r = entropy / log_v if entropy is not None else None
    untrained = bool(math.isfinite(loss) and loss_r >= loss_ratio
                     and (ent_r is None or (math.isfinite(ent_r) and ent_r >= entropy_ratio)))
    return {"measured": True, "source": source, "samples": len(samples), "positions": positions,
            "vocab": int(vocab), "log_v": log_v, "loss": loss, "entropy": entropy,
            "loss_ratio": loss_r, "entropy_ratio": ent_r, "loss_ratio_min": loss_ratio,
            "entropy_ratio_min": entropy_ratio, "untrained": untrained}


def state(ctx: Context) -> dict[str, Any] | None:
    """The cached measurement, made on first use; None when detection is off. A crash while
    measuring is recorded (the quality checks then keep their verdicts), never raised."""
    if not detection_on(ctx):
        return None

    def compute() -> dict[str, Any]:
        from objdebug.core.errors import InputError

        try:
            return measure(ctx)
        except InputError:
            raise
        except Exception as exc:  # the checks that asked keep their own verdicts
            return {"measured": False, "reason": f"{type(exc).__name__}: {exc}"}
    return ctx.provide(state, compute)


def untrained_reason(ctx: Context) -> str | None:
    """'untrained: loss 9.01 vs log V 9.01, ...' when the model is measured untrained, else None."""
    if getattr(ctx.config.task, "kind", "causal-lm") != "causal-lm":
        return None  # the measurement is the causal LM's (next-token loss vs log V): no excuse elsewhere
    v = state(ctx)
    if not v or not v.get("measured") or not v.get("untrained"):
        return None
    return f"untrained: {describe(v)}"


def excuse(ctx: Context, findings: list[Finding], codes: tuple[str, ...]) -> None:
    """Turn WARN/FAIL findings of `codes` into notes (INFO) when the model is untrained.

    ERROR (too few rows, constant scores) and SKIP stay: they are about the data, not the model.
    Asked only when such a finding exists, so a passing quality check costs no measurement.
    """
    judged = [f for f in findings if f.code in codes and f.verdict in (Verdict.WARN, Verdict.FAIL)]
    if not judged:
        return
    reason = untrained_reason(ctx)
    if reason is None:
        return
    fix = get_rule(CODE).fix
    for f in judged:
        f.message = f"{reason}: not judged (would be {f.verdict.value}): {f.message}"
        f.verdict = Verdict.INFO
        f.fix = fix


def result(ctx: Context) -> CheckResult | None:
    """The pipeline-level OBJ004 result when the run measured the model, else None."""
    v = ctx.provided(state)
    if v is None:
        return None
    res = CheckResult(stage=STAGE, check=CHECK, value=v)
    if not v.get("measured"):
        res.findings.append(Finding.of(CODE, Verdict.SKIP, f"model state not measured: {v['reason']}",
                                       check=CHECK, stage=STAGE, condition="model_trained"))
        return res
    how = (f"{describe(v)} over {v['positions'] if v['positions'] is not None else v['samples']} "
           f"{'scored positions' if v['positions'] is not None else 'samples'} of {v['samples']} "
           f"samples; untrained when loss >= {v['loss_ratio_min']:g} x log V"
           + (f" and entropy >= {v['entropy_ratio_min']:g} x log V" if v["entropy"] is not None else "")
           + (" (loss from the objective: end-to-end form)" if v["source"] == "objective" else ""))
    if v["untrained"]:
        res.findings.append(Finding.of(CODE, Verdict.INFO, f"untrained model: {how}; quality checks "
                                       f"(align ranking, correlation, over-smoothing) are notes",
                                       check=CHECK, stage=STAGE, condition="model_trained",
                                       value=v["loss_ratio"]))
    else:
        res.findings.append(Finding.of(CODE, Verdict.PASS, f"trained model: {how}", check=CHECK,
                                       stage=STAGE, condition="model_trained", value=v["loss_ratio"]))
    return res


def summary(v: dict[str, Any]) -> dict[str, Any]:
    """The few numbers the report header shows (stored in the report's `target`)."""
    if not v.get("measured"):
        return {"measured": False, "reason": v.get("reason")}
    return {k: v[k] for k in ("measured", "untrained", "loss", "log_v", "entropy", "loss_ratio",
                              "entropy_ratio", "vocab", "samples", "source")}

