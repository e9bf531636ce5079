"""The pipeline runner: one target loaded once, its contract probed, the chosen stages' checks run
in order on one shared Context, the model state reported first; a RunResult back.

The runner knows checks only through the `checks_of(stage)` it is given (`objdebug.stages.
stage_checks` in `api.run`), so this layer imports no stage. It is also where a verdict is
reviewed after its check ran: a finding that judges what a trained model learned becomes a note
on a model measured untrained (`run_check`, `model_state.excuse`).
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from objdebug.core.config import Config
from objdebug.core.errors import EXIT_CHECK_FAILED, EXIT_OK, InputError
from objdebug.core.findings import Check, CheckResult, Verdict
from objdebug.core.interrupts import Interrupted, swallowed
from objdebug.core.progress import Progress, StageSummary
from objdebug.core.settings import Settings
from objdebug.engine import distributed, host_memory, ms_versions, runtime
from objdebug.engine import row_scoring, watchdog
from objdebug.engine.compile_cache import open_cache, parameter_shapes
from objdebug.engine.core import Engine
from objdebug.engine.target import load_target
from objdebug.pipeline import contract, coverage, model_state, task_kind
from objdebug.pipeline.context import Context, RunOptions
from objdebug.pipeline.pipeline_batches import adopt_conventions
from objdebug.pipeline.profile import Profile, code_selected
from objdebug.pipeline.time_profile import TimeProfile
from objdebug.pipeline.registry import (OPT_IN, STAGES, opted_in, pipeline_order, scores_rows,
                                        stage_skip_reason)

ChecksOf = Callable[[str], list[Check]]


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
    if stages:
        return pipeline_order(stages)
    if cfg.run.stages:  # named as the config key, not as a flag the user did not pass
        return pipeline_order(cfg.run.stages, "run.stages", cfg.source)
    # the profile's choice: opt-in stages join when their section is configured
    names = list(profile.stages or [s for s in STAGES if s not in OPT_IN])
    names += [s for s in OPT_IN if opted_in(cfg, s) and s not in names]
    return pipeline_order(names)


def run_check(check: Check, ctx: Any, th: Settings) -> CheckResult:
    """Run one check (its crash is an ERROR finding) and review its verdicts: the codes that judge
    a trained model (`Check.needs_trained`) are notes on a model measured untrained. A check
    that does not apply to the target (`Check.applies`: another task kind, another objective call)
    leaves an empty result, as `_plan` drops it."""
    if not check.applies(ctx.config):
        return CheckResult(check.stage, check.name)
    result = check.run(ctx, th)
    if check.needs_trained and result.error is None:
        model_state.excuse(ctx, result.findings, check.needs_trained)
    return result


def skipped(check, reason: str):
    """A CheckResult with one SKIP finding and `reason` (the check does not run)."""
    result = CheckResult(stage=check.stage, check=check.name)
    result.findings.append(check._finding(check.codes[0], Verdict.SKIP, reason, ""))
    return result


def run_pipeline(cfg: Config, chosen: list[str], profile: Profile, options: dict[str, Any] | None,
                 out_dir: str | None, strict: bool, select: list[str], ignore: list[str], debug: bool,
                 progress: Progress, compile_cache: str | None, checks_of: ChecksOf,
                 cache_named: bool = True) -> RunResult:
    """Load the target, probe its contract, run each chosen stage's checks (`checks_of(stage)`) and
    the model state; never raises for a failing check. Interrupts say where the run stopped.
    `cache_named`: the user chose `compile_cache` (else it is the default, used only when private)."""
    result = RunResult(config=cfg, profile=profile, stages=chosen, options=dict(options or {}),
                       versions=runtime.versions(), strict=strict,
                       created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    t0 = time.perf_counter()
    try:
        _run_stages(cfg, result, profile, chosen, select, ignore, options, out_dir, debug, progress,
                    compile_cache, checks_of, cache_named)
    except (Interrupted, Exception) as exc:  # say where the run stopped: the CLI prints it
        if not isinstance(exc, Interrupted):
            if swallowed() is None:
                raise
            exc = swallowed()  # a signal that the user's code or MindSpore turned into an error
        done = [s for s in chosen if s in result.timings]
        exc.after = done[-1] if done else None
        exc.during = next((s for s in chosen if s not in result.timings), None) \
            if result.timings.get("load") is not None else "load"
        _close_time_profile(result, time.perf_counter() - t0)
        raise exc from None
    result.timings["total"] = time.perf_counter() - t0
    _close_time_profile(result, result.timings["total"])
    return result


def _close_time_profile(result: RunResult, total: float) -> None:
    """The run's TimeProfile as the plain dict the reports carry (`extra.time_profile`)."""
    times = result.extra.get("time_profile")
    if isinstance(times, TimeProfile):
        result.extra["time_profile"] = times.to_dict(total)


def _run_stages(cfg, result, profile, chosen, select, ignore, options, out_dir, debug, progress,
                compile_cache, checks_of, cache_named=True) -> None:
    runtime.setup(cfg.run.device, cfg.run.mode, cfg.run.seed)
    host_memory.start_run()
    world = distributed.world()  # rank 0 of 1 unless started by msrun (`--workers N`)
    if world.distributed:
        result.extra["workers"] = world.size
    times = result.extra["time_profile"] = TimeProfile()  # where the time goes (time_profile.py)
    with runtime.scratch_dir():
        t = time.perf_counter()
        times.start("load")
        target = load_target(cfg)
        times.stop()
        result.timings["load"] = time.perf_counter() - t
        result.target = target.describe()
        engine = Engine(target, batch_size=profile.section("engine")["batch_size"],
                        progress=progress)
        ctx = Context(config=cfg, target=target, engine=engine, profile=profile,
                      options=RunOptions.of(options), out_dir=out_dir, debug=debug)
        # msrun workers would share one directory (and MindSpore writes one folder per rank)
        cache = open_cache(compile_cache, cfg, profile, chosen, dict(options or {}),
                           engine.batch_size,
                           refuse="not with --workers (one cache per process)" if world.distributed
                           else ms_versions.cache_refusal(ms_versions.installed()),
                           params=parameter_shapes(target), named=cache_named)
        cache.attach(engine)
        with cache:  # writes the cache's manifest after a clean run only
            engine.check = "contract"
            # on CPU, a run that only scores rows scores them through fused static graphs
            engine.static_rows = target.model is not None and cfg.task.kind == "causal-lm" \
                and row_scoring.static_rows_wanted(
                cfg.run.device, chosen, contract.planned_buckets(target, engine))
            # the contract on one small batch: exit 2 if broken; through the per-sample graph
            # when a stage will score rows one by one (no graph of the probe's own)
            times.start("contract", engine)
            if cfg.task.kind == "causal-lm":
                contract.check_target(target, engine, per_sample=scores_rows(chosen))
            else:  # a [task] kind's shapes (issue 47): classification, tagging, embedding
                task_kind.check_target(target, engine)
            times.stop(engine)
            result.target = target.describe()  # again: the probe may add notes (model_inputs)
            planned = _plan(cfg, profile, chosen, checks_of)
            try:
                _prepare(ctx, planned, debug, "run")
                for stage, skip, checks in planned:
                    engine.stage = stage
                    if stage != "batches":  # the batches win after their own stage judged them
                        adopt_conventions(ctx)
                    # the headroom rule of a compile before each stage too: a stage can take its
                    # memory on the host without compiling anything (decompose on a 32000-token
                    # vocabulary: +1.2 GiB of logits to a process at 18.9 GiB)
                    engine.make_room("")
                    progress.stage_start(stage)
                    watchdog.stage(stage)
                    t = time.perf_counter()
                    times.start(stage, engine)
                    _prepare(ctx, [(stage, skip, checks)], debug, "stage")
                    first_result, first_compile = len(result.results), engine.compiles.count
                    thresholds = profile.section(stage)
                    for check in checks:
                        engine.check = check.name  # its compiles and graph uses are charged to it
                        res = skipped(check, skip) if skip else run_check(check, ctx, thresholds)
                        res.findings = [f for f in res.findings if code_selected(f.code, select, ignore)]
                        result.results.append(res)
                    engine.check = ""
                    times.stop(engine)
                    result.timings[stage] = time.perf_counter() - t
                    progress.stage_end(StageSummary.of(stage, result.results[first_result:],
                                                       result.timings[stage],
                                                       engine.compiles.records[first_compile:]))
            finally:
                ctx.close()  # background work no check collected goes with the run
        result.target = target.describe()  # again: a check may add notes (the label pairing)
        engine.check = "model-state"
        times.start("model-state", engine)
        _report_model_state(ctx, result, select, ignore)  # adds target["model_state"]
        times.stop(engine)
        _report_lost_coverage(target, result, select, ignore)
        result.extra.update(ctx.report_extra)
        # what the run held at most: this process, and the measurements run in their own
        result.extra["memory"] = host_memory.run_peaks()
        if cache.status != "off":
            result.extra["compile_cache"] = cache.summary()
    result.compiles = engine.compiles.to_dict()


def _plan(cfg: Config, profile: Profile, chosen: list[str], checks_of: ChecksOf):
    """[(stage, skip reason or None, the checks the profile keeps)] in pipeline order."""
    planned = []
    for stage in chosen:
        thresholds = profile.section(stage)
        # a check switched off by the profile, or one that does not apply to the target
        # (`Check.applies`: its task kinds, its objective call), leaves no result at all
        planned.append((stage, stage_skip_reason(cfg, stage),
                        [c for c in checks_of(stage) if c.enabled(thresholds) and c.applies(cfg)]))
    return planned


def _prepare(ctx: Context, planned, debug: bool, at: str) -> None:
    """`Check.prepare` of every check of `planned` that will run and prepares `at` ("run": once,
    before any stage; "stage": when its stage starts): work that can go on beside the checks
    before it starts now. It is only ever a head start (the check measures everything itself
    when nothing was prepared), so a failure here is not the check's result: it is dropped,
    and the check meets it again, in its own run, if it is real. An InputError is the exception:
    a value only the probed model or the data can judge (`[packing] separator` beyond the
    vocabulary) ends the run with exit 2 here, before any stage's work."""
    for stage, skip, checks in planned:
        if skip:
            continue
        thresholds = ctx.profile.section(stage)
        for check in checks:
            if type(check).prepare is Check.prepare or check.prepare_at != at:
                continue  # nothing to start (and no skip_reason asked before its stage's turn)
            ctx.engine.check = check.name
            try:
                check.prepare(ctx, thresholds)
            except InputError:
                raise
            except Exception:  # noqa: BLE001 - see the docstring
                if debug:
                    raise
    ctx.engine.check = ""


def _report_model_state(ctx: Context, result: RunResult, select: list[str], ignore: list[str]) -> None:
    """The model-state measurement (OBJ004), when a check made it: first in the results, and its
    numbers in the report's target, so every report shows it at the top."""
    res = model_state.result(ctx)
    if res is None:
        return
    result.target["model_state"] = model_state.summary(res.value)
    res.findings = [f for f in res.findings if code_selected(f.code, select, ignore)]
    result.results.insert(0, res)


def _report_lost_coverage(target, result: RunResult, select: list[str], ignore: list[str]) -> None:
    """OBJ006: a library model whose output head was not found lost its logit checks to skips;
    one WARN names them (pipeline/coverage.py), never a silent pass."""
    res = coverage.lost_logit_checks((target.info or {}).get("library_model"), result.results)
    if res is None:
        return
    res.findings = [f for f in res.findings if code_selected(f.code, select, ignore)]
    result.results.append(res)
