"""The library entry point: load a target once, run stages, judge, return a RunResult.

    from objdebug import api
    result = api.run(api.load_config("objdebug.toml"), stages=["align"], baseline="old.json")
    api.write_reports(result, json="r.json", junit="r.xml")  # all replaced, or none
    result.exit_code  # 0 pass, 1 a check failed

The `objdebug` command is a thin shell around these two calls: a Python caller gets the same
comparison with a baseline and the same report files.
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from objdebug import contract, distributed
from objdebug.engine import runtime
from objdebug.engine.compile_cache import default_root, open_cache, parameter_shapes
from objdebug.config import Config, load_config  # noqa: F401  (re-exported)
from objdebug.context import Context, RunOptions
from objdebug.engine.data import preflight
from objdebug.engine.core import Engine
from objdebug.errors import EXIT_CHECK_FAILED, EXIT_OK
from objdebug.findings import CheckResult, Verdict
from objdebug.interrupts import Interrupted, swallowed
from objdebug.profile import Profile, code_selected, load_profile
from objdebug.progress import Progress, StageSummary
from objdebug.stages import (STAGES, pipeline_order, scores_rows, skipped, stage_checks,
                             stage_skip_reason)
from objdebug.engine.target import load_target
from objdebug import selection
from objdebug.engine import watchdog
from objdebug.report.json_report import SCHEMA_VERSION  # noqa: F401  (re-exported)


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
    return pipeline_order(profile.stages or list(STAGES))


def run(cfg: Config, *, stages: list[str] | None = None, profile: Profile | str | None = None,
        options: dict[str, Any] | None = None, out_dir: str | None = None, strict: bool = False,
        select: list[str] | None = None, ignore: list[str] | None = None, debug: bool = False,
        progress: Progress | None = None, compile_cache: str | bool | None = None,
        baseline: str | Path | dict[str, Any] | None = None) -> RunResult:
    """Run `stages` on the target described by `cfg`; never raises for a failing check.

    `compile_cache`: a directory for MindSpore's compile cache, checked graph by graph (see
    objdebug/engine/compile_cache.py); it only helps a process's first run. None: the config's
    `run.compile_cache`, else off; True: that, else ./.objdebug_cache (the CLI's default; off when
    OBJDEBUG_NO_CACHE is set); False: off.
    `baseline`: an earlier JSON report (a path, or the dict `baseline.load` returned); its
    regressions are appended as the "baseline" stage's findings (OBJ0xx) and count for the exit code.
    `out_dir`: the report's figures are drawn there as PNG files too (report/figures.py).
    """
    old = _load_baseline(baseline)  # a bad baseline is an input error before any work
    if out_dir:  # checks run inside a scratch directory: a relative path would be lost there
        out_dir = str(Path(out_dir).resolve())
    if compile_cache is True:  # the CLI's default: the configured directory, else ./.objdebug_cache
        compile_cache = cfg.run.compile_cache or default_root()
    elif compile_cache is None:
        compile_cache = cfg.run.compile_cache
    if compile_cache:  # same: the cache is opened inside the scratch directory
        compile_cache = str(Path(compile_cache).expanduser().resolve())
    else:
        compile_cache = None  # False: off, whatever the config says
    if not isinstance(profile, Profile):
        profile = load_profile(profile or cfg.run.profile)
    chosen = resolve_stages(cfg, profile, stages)
    preflight(cfg)  # data-file errors before MindSpore starts
    # every prefix upper-cased and matching a known code, the whole keeping some code of the
    # stages that run: a selection that drops everything would pass without checking (issue 23)
    select = selection.prefixes(select, "--select", "command line")
    ignore = selection.prefixes(ignore, "--ignore", "command line")
    user_select, user_ignore = select, ignore  # the baseline comparison adds the profile's itself
    select = (selection.prefixes(profile.data.get("select", []), "select", profile.source)
              + selection.prefixes(cfg.run.select, "run.select", cfg.source) + select)
    ignore = (selection.prefixes(profile.data.get("ignore", []), "ignore", profile.source)
              + selection.prefixes(cfg.run.ignore, "run.ignore", cfg.source) + ignore)
    selection.require_something(chosen, select, ignore, baseline=old is not None)
    progress = progress or Progress()  # no display unless the caller passes one
    # the display runs from the first second (importing MindSpore and loading take a while) and
    # stops on any exception, Ctrl-C included, which goes on to the caller
    with progress.running(chosen):
        progress.stage_start("load")
        result = _run(cfg, chosen, profile, options, out_dir, strict, select, ignore, debug,
                      progress, compile_cache)
    if old is not None:
        from objdebug import baseline as baseline_mod

        baseline_mod.apply(result, old, select=user_select, ignore=user_ignore)
    empty = selection.nothing_checked(result.results)  # never a pass without a check
    if empty is not None:
        result.results.append(empty)
    if out_dir:
        from objdebug.report import json_report
        from objdebug.report.figures import write_pngs

        figures = write_pngs(json_report.to_dict(result), out_dir)
        if figures:
            result.extra.setdefault("figures", {}).update(figures)
    return result


def _load_baseline(baseline: str | Path | dict[str, Any] | None) -> dict[str, Any] | None:
    if baseline is None or isinstance(baseline, dict):
        return baseline
    from objdebug import baseline as baseline_mod

    return baseline_mod.load(str(baseline))


def write_reports(result: RunResult | dict[str, Any], *, json: str | Path | None = None,
                  junit: str | Path | None = None, junit_warnings_as_skipped: bool = False,
                  html: str | Path | None = None, markdown: str | Path | None = None,
                  gitlab: str | Path | None = None):
    """Write the report files of a run (a RunResult, or a saved report's dict from
    `json_report.load`): every file is replaced, or none (report.all_or_nothing). Returns the
    ReportSet (its `paths`, and `committed`)."""
    from objdebug.report import all_or_nothing, json_report
    from objdebug.report import gitlab as gitlab_report
    from objdebug.report import html as html_report
    from objdebug.report import junit as junit_report
    from objdebug.report import markdown as markdown_report
    from objdebug.report.figures import draw_all

    report = json_report.to_dict(result) if isinstance(result, RunResult) else result
    with all_or_nothing() as written:
        if json:
            json_report.write_dict(report, str(json))
        if junit:
            junit_report.write(report, str(junit), warnings_as_skipped=junit_warnings_as_skipped)
        figures = draw_all(report) if (html or markdown) else None
        if html:
            html_report.write(report, html, figures)
        if markdown:
            markdown_report.write(report, markdown, figures)
        if gitlab:
            gitlab_report.write(report, str(gitlab))
    return written


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
        engine = Engine(target, batch_size=profile.section("engine")["batch_size"],
                        progress=progress)
        ctx = Context(config=cfg, target=target, engine=engine, profile=profile,
                      options=RunOptions.of(options), out_dir=out_dir, debug=debug)
        # msrun workers would share one directory (and MindSpore writes one folder per rank)
        cache = open_cache(compile_cache, cfg, profile, chosen, dict(options or {}),
                           engine.batch_size,
                           refuse="not with --workers (one cache per process)" if world.distributed else "",
                           params=parameter_shapes(target))
        cache.attach(engine)
        with cache:  # writes the cache's manifest after a clean run only
            engine.check = "contract"
            # the contract on one small batch: exit 2 if broken; through the per-sample graph
            # when a stage will score rows one by one (no graph of the probe's own)
            contract.check_target(target, engine, per_sample=scores_rows(chosen))
            result.target = target.describe()  # again: the probe may add notes (model_inputs)
            for stage in chosen:
                engine.stage = stage
                progress.stage_start(stage)
                watchdog.stage(stage)
                t = time.perf_counter()
                first_result, first_compile = len(result.results), engine.compiles.count
                thresholds = profile.section(stage)
                skip = stage_skip_reason(cfg, stage)
                for check in stage_checks(stage):
                    if not check.enabled(thresholds):
                        continue  # switched off by the profile: no result at all
                    engine.check = check.name  # its compiles and graph uses are charged to it
                    res = skipped(check, skip) if skip else check.run(ctx, thresholds)
                    res.findings = [f for f in res.findings if code_selected(f.code, select, ignore)]
                    result.results.append(res)
                engine.check = ""
                result.timings[stage] = time.perf_counter() - t
                progress.stage_end(StageSummary.of(stage, result.results[first_result:],
                                                   result.timings[stage],
                                                   engine.compiles.records[first_compile:]))
        engine.check = "model-state"
        _report_model_state(ctx, result, select, ignore)
        result.extra.update(ctx.report_extra)
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
