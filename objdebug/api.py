"""The library entry point: load a target once, run stages, judge, return a RunResult.

    from objdebug import api
    result = api.run(api.load_config("objdebug.toml"), stages=["align"])
    result.exit_code  # 0 pass, 1 a check failed
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from objdebug import contract, distributed
from objdebug.engine import runtime
from objdebug.engine.compile_cache import open_cache
from objdebug.config import Config, load_config  # noqa: F401  (re-exported)
from objdebug.context import Context
from objdebug.engine.data import preflight
from objdebug.engine.core import Engine
from objdebug.errors import EXIT_CHECK_FAILED, EXIT_OK
from objdebug.findings import CheckResult, Verdict
from objdebug.interrupts import Interrupted, swallowed
from objdebug.profile import Profile, code_selected, load_profile
from objdebug.progress import Progress, StageSummary
from objdebug.stages import STAGES, skipped, stage_checks, stage_skip_reason
from objdebug.engine.target import load_target

SCHEMA_VERSION = 1


@dataclass
class RunResult:
    config: Config
    profile: Profile
    stages: list[str]
    results: list[CheckResult] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    compiles: dict[str, Any] = field(default_factory=dict)
    target: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    strict: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. baseline comparison, figure paths

    @property
    def findings(self):
        return [f for r in self.results for f in r.findings]

    def counts(self) -> dict[str, int]:
        out = {v.value: 0 for v in Verdict}
        for f in self.findings:
            out[f.verdict.value] += 1
        return out

    @property
    def exit_code(self) -> int:
        verdicts = {f.verdict for f in self.findings}
        if Verdict.FAIL in verdicts:
            return EXIT_CHECK_FAILED
        if Verdict.ERROR in verdicts and self.profile.error_fails:
            return EXIT_CHECK_FAILED
        if Verdict.WARN in verdicts and (self.strict or self.profile.fail_on_warn):
            return EXIT_CHECK_FAILED
        return EXIT_OK

    @property
    def passed(self) -> bool:
        return self.exit_code == EXIT_OK


def resolve_stages(cfg: Config, profile: Profile, stages: list[str] | None) -> list[str]:
    chosen = stages or cfg.run.stages or profile.stages or list(STAGES)
    for s in chosen:
        if s not in STAGES:
            from objdebug.errors import InputError

            raise InputError(f"For '--stages', each stage must be in {list(STAGES)}, but got '{s}'.")
    return [s for s in STAGES if s in chosen]  # always pipeline order


def run(cfg: Config, *, stages: list[str] | None = None, profile: Profile | str | None = None,
        options: dict[str, Any] | None = None, out_dir: str | None = None, strict: bool = False,
        select: list[str] | None = None, ignore: list[str] | None = None, debug: bool = False,
        progress: Progress | None = None, compile_cache: str | None = None) -> RunResult:
    """Run `stages` on the target described by `cfg`; never raises for a failing check.

    `compile_cache` (or `run.compile_cache`): a directory for MindSpore's compile cache, opt-in
    and checked graph by graph (see objdebug/engine/compile_cache.py); it only helps a process's first run.
    """
    if out_dir:  # checks run inside a scratch directory: a relative path would be lost there
        out_dir = str(Path(out_dir).resolve())
    if compile_cache:  # same: the cache is opened inside the scratch directory
        compile_cache = str(Path(compile_cache).expanduser().resolve())
    if not isinstance(profile, Profile):
        profile = load_profile(profile or cfg.run.profile)
    chosen = resolve_stages(cfg, profile, stages)
    preflight(cfg)  # data-file errors before MindSpore starts
    select = list(profile.data.get("select", [])) + list(cfg.run.select) + list(select or [])
    ignore = list(profile.data.get("ignore", [])) + list(cfg.run.ignore) + list(ignore or [])
    progress = progress or Progress()  # no display unless the caller passes one
    # the display runs from the first second (importing MindSpore and loading take a while) and
    # stops on any exception, Ctrl-C included, which goes on to the caller
    with progress.running(chosen):
        progress.stage_start("load")
        return _run(cfg, chosen, profile, options, out_dir, strict, select, ignore, debug, progress,
                    compile_cache)


def _run(cfg: Config, chosen: list[str], profile: Profile, options: dict[str, Any] | None,
         out_dir: str | None, strict: bool, select: list[str], ignore: list[str], debug: bool,
         progress: Progress, compile_cache: str | None) -> RunResult:
    result = RunResult(config=cfg, profile=profile, stages=chosen, options=dict(options or {}),
                       versions=runtime.versions(), strict=strict,
                       created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    t0 = time.perf_counter()
    try:
        _run_stages(cfg, result, profile, chosen, select, ignore, options, out_dir, debug, progress,
                    compile_cache)
    except (Interrupted, Exception) as exc:  # say where the run stopped: the CLI prints it
        if not isinstance(exc, Interrupted):
            if swallowed() is None:
                raise
            exc = swallowed()  # a signal that the user's code or MindSpore turned into an error
        done = [s for s in chosen if s in result.timings]
        exc.after = done[-1] if done else None
        exc.during = next((s for s in chosen if s not in result.timings), None) \
            if result.timings.get("load") is not None else "load"
        raise exc from None
    result.timings["total"] = time.perf_counter() - t0
    return result


def _run_stages(cfg, result, profile, chosen, select, ignore, options, out_dir, debug, progress,
                compile_cache) -> None:
    runtime.setup(cfg.run.device, cfg.run.mode, cfg.run.seed)
    world = distributed.world()  # rank 0 of 1 unless started by msrun (`--workers N`)
    if world.distributed:
        result.extra["workers"] = world.size
    with runtime.scratch_dir():
        t = time.perf_counter()
        target = load_target(cfg)
        result.timings["load"] = time.perf_counter() - t
        result.target = target.describe()
        engine = Engine(target, batch_size=profile.section("engine").get("batch_size", 8),
                        progress=progress)
        ctx = Context(config=cfg, target=target, engine=engine, profile=profile,
                      options=dict(options or {}), out_dir=out_dir, debug=debug)
        cache = open_cache(compile_cache or cfg.run.compile_cache, cfg, profile, chosen,
                           dict(options or {}), engine.batch_size)
        cache.attach(engine)
        with cache:  # writes the cache's manifest after a clean run only
            contract.check_target(target, engine)  # the contract on one small batch: exit 2 if broken
            result.target = target.describe()  # again: the probe may add notes (model_inputs)
            for stage in chosen:
                engine.stage = stage
                progress.stage_start(stage)
                t = time.perf_counter()
                first_result, first_compile = len(result.results), engine.compiles.count
                thresholds = profile.section(stage)
                skip = stage_skip_reason(cfg, stage)
                for check in stage_checks(stage):
                    if not check.enabled(thresholds):
                        continue  # switched off by the profile: no result at all
                    res = skipped(check, skip) if skip else check.run(ctx, thresholds)
                    res.findings = [f for f in res.findings if code_selected(f.code, select, ignore)]
                    result.results.append(res)
                result.timings[stage] = time.perf_counter() - t
                progress.stage_end(StageSummary.of(stage, result.results[first_result:],
                                                   result.timings[stage],
                                                   engine.compiles.records[first_compile:]))
        _report_model_state(ctx, result, select, ignore)
        result.extra.update(ctx.cache.get("report_extra", {}))
        if cache.status != "off":
            result.extra["compile_cache"] = cache.summary()
    result.compiles = engine.compiles.to_dict()


def _report_model_state(ctx: Context, result: RunResult, select: list[str], ignore: list[str]) -> None:
    """The model-state measurement (OBJ004), when a check made it: first in the results, and its
    numbers in the report's target, so every report shows it at the top."""
    from objdebug import model_state

    res = model_state.result(ctx)
    if res is None:
        return
    result.target["model_state"] = model_state.summary(res.value)
    res.findings = [f for f in res.findings if code_selected(f.code, select, ignore)]
    result.results.insert(0, res)
