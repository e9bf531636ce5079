"""The stage registry: every stage, in pipeline order, with its one-line summary.

Data only (no MindSpore, no stage module): the CLI builds one command per stage from it, profiles
and the API validate stage names with it. The stages' checks are `objdebug.stages.stage_checks`.
A stage's number is its place in this order (`Stage.number`), so help, README and docs agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from objdebug.core.config import POLICY_CALLS, PREFERENCE_CALLS, REWARD_CALL
from objdebug.core.errors import InputError


@dataclass(frozen=True)
class Stage:
    name: str
    summary: str  # the stage command's help
    scores_rows: bool = False  # scores rows one by one (the engine's per-sample objective graph)

    @property
    def number(self) -> int:
        """The stage's place in the pipeline: `batches` (the data, before any objective stage) is
        stage 0, align stage 1, ..."""
        return STAGES.index(self.name)

    @property
    def help(self) -> str:
        return f"Stage {self.number}: {self.summary}"


REGISTRY: tuple[Stage, ...] = (
    Stage("batches", "Your pipeline's real batches (data.batches) against the objective and the declared conventions: padding and prompt labels it scores, pad/label/BOS/EOS ids, padding side, label layout vs shift, rows with nothing to learn, ids outside the vocabulary, attention mask vs padding.",
          scores_rows=True),
    Stage("align", "Loss must order good < medium < bad answers to the same prompt, with a clear gap.",
          scores_rows=True),
    Stage("grad", "Gradient health (norms, disconnected/NaN parameters, padding leakage, supervision coverage, autodiff vs finite differences)."),
    Stage("invariants", "Invariants of a correct objective (label alignment, logit shift, ignored positions, upstream gradient, unused settings, token weighting, side effects, empty rows)."),
    Stage("decompose", "Components of a composite loss: shares, dead terms, scale imbalance, gradient share.",
          scores_rows=True),
    Stage("correlate", "Per-sample loss against human quality scores (Pearson with CI, Spearman, Kendall).",
          scores_rows=True),
    Stage("preference", "Preference objectives (DPO, IPO, SimPO, hinge) on real pairs: zero point, symmetry, direction, masking, length, settings, agreement."),
    Stage("policy", "RLHF objectives (only with [objective] call = \"policy\", \"policy-model\" or \"reward\"): a policy-gradient loss (PPO, GRPO, DAPO, Dr. GRPO) with its KL term on real rollouts (zero point, KL estimator, token weights and aggregation, masks and positions, clip, settings, one step), or a reward model's loss on its real rewards (zero point, chosen/rejected swap, one step, the reward read at the last real token, settings, agreement with human scores)."),
    Stage("stress", "Long inputs, all-padding, garbage ids, fp16, padding invariance.", scores_rows=True),
    Stage("packing", "Packed sequences (only with a packing section in the config, or on the packed rows of data.batches): document isolation, same loss as unpacked, boundary labels, token weighting.",
          scores_rows=True),
)
STAGES = tuple(s.name for s in REGISTRY)  # pipeline order
# stages that run only when the target asks for them (a config section); a run that names no
# stages gets them only then, so a target without the section reports exactly what it did before
# (the config key that switches a stage on: a section, or a dotted section.key)
# (packing also runs on the pipeline's own batches: their packed rows, found from the batches'
# boundaries, measured as the pipeline packs them; it skips, saying why, where they hold none)
OPT_IN = {"batches": ("data.batches",), "packing": ("packing", "data.batches"),
          "policy": ("policy_objective", f"objective.call={REWARD_CALL}")}


def opted_in(config, name: str) -> bool:
    """Whether the target sets a key that switches the opt-in stage `name` on."""
    for key in OPT_IN[name]:
        key, _, wanted = key.partition("=")  # "section.key=value": on when the key has that value
        value = config
        for part in key.split("."):
            value = getattr(value, part, None)
        if value is not None and (not wanted or value == wanted):
            return True
    return False


def scores_rows(names) -> bool:
    """Whether any of these stages scores rows one by one (the contract probe then checks the
    objective through that per-sample graph instead of compiling one of its own)."""
    return any(s.scores_rows for s in REGISTRY if s.name in names)


def pipeline_order(names, setting: str = "--stages", source: str | None = None) -> list[str]:
    """`names` checked against the registry (InputError naming `setting`), in pipeline order."""
    bad = [n for n in names if n not in STAGES]
    if bad:
        got = f"'{bad[0]}'" if len(bad) == 1 else str(bad)
        raise InputError(f"For '{setting}', each stage must be in {list(STAGES)}, but got {got}.",
                         source=source)
    return [s for s in STAGES if s in names]


def stage_skip_reason(config, name: str) -> str | None:
    """Why a whole stage cannot run on this target, or None.

    A target whose [objective] is a preference call has no `loss(logits, labels)`: the stages that
    test one are skipped; only the preference stage runs.
    """
    if name == "batches" and not opted_in(config, name):
        return ("no [data] batches: the batches stage audits the pipeline's real batches and runs "
                "only when the target names them (docs/config.md)")
    if name == "policy" and not opted_in(config, name):
        return ("[objective] call is not \"policy\", \"policy-model\" or \"reward\": the policy stage checks "
                "a policy-gradient objective or a reward model's loss and runs only on one (docs/config.md)")
    if name in ("policy", "batches"):  # the batches stage reads the batches: its checks that
        return None                     # probe a loss(logits, labels) skip one by one, saying why
    if config.objective.call in POLICY_CALLS:
        return (f"[objective] call = \"{config.objective.call}\": the objective takes policy rollouts, "
                f"not (logits, labels); the {name} stage needs a cross-entropy-style objective")
    if config.objective.call == REWARD_CALL:
        return (f"[objective] call = \"{REWARD_CALL}\": the objective takes the reward model's scalar "
                f"rewards, not (logits, labels); the {name} stage needs a cross-entropy-style objective")
    if name in OPT_IN and not opted_in(config, name):
        return (f"no [{name}] section and no [data] batches: the {name} stage checks how the "
                f"pipeline packs documents and runs only when the target describes it or names "
                f"its batches (docs/config.md)")
    if name != "preference" and config.objective.call in PREFERENCE_CALLS:
        return (f"[objective] call = \"{config.objective.call}\": the objective takes preference pairs, "
                f"not (logits, labels); the {name} stage needs a cross-entropy-style objective "
                "(put the preference loss under [preference] to check both)")
    return None
