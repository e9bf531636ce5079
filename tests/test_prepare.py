"""When the runner calls `Check.prepare` (objdebug/pipeline/runner.py): once per run, after the
contract probe, before any stage (`prepare_at = "run"`), or when the check's own stage starts
(`prepare_at = "stage"`); a failure there is dropped and the check still runs."""

from __future__ import annotations

from objdebug import api
from objdebug.core.config import load_config
from objdebug.core.findings import Check, Condition, Verdict

from .conftest import TARGETS

EVENTS: list[str] = []


class _Recording(Check):
    """A check that records when its prepare and measure run (fake: no MindSpore of its own)."""

    codes = ("OBJ101",)
    fails = False

    def prepare(self, ctx, th) -> None:
        EVENTS.append(f"prepare {self.name}")
        if self.fails:
            raise RuntimeError("a head start that broke")

    def measure(self, ctx, th):
        EVENTS.append(f"measure {self.name}")
        return {"x": 1.0}

    def conditions(self, th):
        return [Condition("OBJ101", "recorded", lambda v: (Verdict.PASS, "ran", v["x"]))]


class AtRun(_Recording):
    name, stage = "at-run", "align"


class FirstOfStress(_Recording):
    name, stage = "first-of-stress", "stress"


class AtStage(_Recording):
    name, stage, prepare_at = "at-stage", "stress", "stage"
    fails = True


def test_prepare_runs_at_the_run_start_or_when_its_stage_starts(monkeypatch):
    checks = {"align": [AtRun()], "stress": [FirstOfStress(), AtStage()]}
    monkeypatch.setattr(api, "stage_checks", lambda stage: checks.get(stage, []))
    EVENTS.clear()
    res = api.run(load_config(TARGETS / "tiny" / "objdebug.toml"), stages=["align", "stress"],
                  compile_cache=False)
    assert EVENTS == ["prepare at-run", "prepare first-of-stress",  # before any stage
                      "measure at-run",
                      "prepare at-stage", "measure first-of-stress", "measure at-stage"]
    # the stage's prepare raised: dropped, the check ran and passed
    assert [(r.check, [f.verdict for f in r.findings]) for r in res.results] == [
        ("at-run", [Verdict.PASS]), ("first-of-stress", [Verdict.PASS]), ("at-stage", [Verdict.PASS])]
