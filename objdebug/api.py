"""The library entry point: load a target once, run stages, judge, return a RunResult.

    from objdebug import api
    result = api.run(api.load_config("objdebug.toml"), stages=["align"], baseline="old.json")
    api.write_reports(result, json="r.json", junit="r.xml")  # all replaced, or none
    result.exit_code  # 0 pass, 1 a check failed

The `objdebug` command is a thin shell around these two calls: a Python caller gets the same
comparison with a baseline and the same report files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from objdebug.core.config import Config, load_config, parse_override
from objdebug.core.errors import InputError
from objdebug.core.progress import Progress
from objdebug.engine import distributed
from objdebug.engine.compile_cache import default_root
from objdebug.engine.data import preflight
from objdebug.pipeline import selection
from objdebug.pipeline.profile import Profile, load_profile
from objdebug.pipeline.runner import RunResult, resolve_stages, run_pipeline  # noqa: F401  (re-exported)
from objdebug.report.json_report import SCHEMA_VERSION  # noqa: F401  (re-exported)
from objdebug.stages import stage_checks


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
    named = compile_cache is not True or bool(cfg.run.compile_cache)  # else the default: checked
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
    if cfg.task.kind != "causal-lm":  # a [task] kind's rows: labels, tags, pairs (issue 47)
        from objdebug.engine.tasks import preflight as task_preflight
        task_preflight(cfg)
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
        result = run_pipeline(cfg, chosen, profile, options, out_dir, strict, select, ignore,
                              debug, progress, compile_cache, stage_checks, cache_named=named)
    if old is not None:
        from objdebug.pipeline import baseline as baseline_mod

        baseline_mod.apply(result, old, select=user_select, ignore=user_ignore)
    # a stage its data opts in that checked nothing: a lost check, never a quiet pass
    result.results.extend(selection.stages_checking_nothing(cfg, result.results))
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
    from objdebug.pipeline import baseline as baseline_mod

    return baseline_mod.load(str(baseline))


def write_reports(result: RunResult | dict[str, Any], *, json: str | Path | None = None,
                  junit: str | Path | None = None, junit_warnings_as_skipped: bool = False,
                  html: str | Path | None = None, markdown: str | Path | None = None,
                  gitlab: str | Path | None = None, commit: bool = True):
    """Write the report files of a run (a RunResult, or a saved report's dict from
    `json_report.load`): every file is replaced, or none (report.all_or_nothing). Returns the
    ReportSet (its `paths`, and `committed`; with `commit=False` only its temporaries, `staged`)."""
    from objdebug.report import all_or_nothing, json_report
    from objdebug.report import gitlab as gitlab_report
    from objdebug.report import html as html_report
    from objdebug.report import junit as junit_report
    from objdebug.report import markdown as markdown_report
    from objdebug.report.figures import draw_all

    report = json_report.to_dict(result) if isinstance(result, RunResult) else result
    with all_or_nothing(commit) as written:
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


# --------------------------------------------------------------------------- one command's work
# What `objdebug run`, `demo` and the stage commands do, as data in and an outcome out: the CLI
# parses into a Request, calls `prepare` (every input error before any work) and `execute`.
def load(config=None, demo: bool = False, sets=None, device=None, mode=None, seed=None,
         checkpoint=None) -> Config:
    """The config with the command line's overrides (`--set`, `--device`, ...) over it; an error
    in an overridden key names the flag that set it."""
    overrides, origins = {}, {}
    for text in sets or []:
        key, value = parse_override(text)
        overrides[key], origins[key] = value, f"--set {text}"
    checkpoint_text = checkpoint
    checkpoint = str(Path(checkpoint).resolve()) if checkpoint is not None else None
    for key, value, flag in (("run.device", device, "--device"), ("run.mode", mode, "--mode"),
                             ("run.seed", seed, "--seed"),
                             ("model.checkpoint", checkpoint, "--checkpoint")):
        if value is not None:
            overrides[key] = value
            origins[key] = f"{flag} {checkpoint_text if flag == '--checkpoint' else value}"
    return load_config(config, overrides=overrides, demo=demo, origins=origins)


OUTPUT_FORMATS = ("text", "github", "gitlab")


def output_format(value: str | None) -> str:
    """--output-format, or what the CI environment implies: GitHub Actions sets GITHUB_ACTIONS=true."""
    if value is None:
        return "github" if os.environ.get("GITHUB_ACTIONS") == "true" else "text"
    if value.lower() not in OUTPUT_FORMATS:
        raise InputError(f"For '--output-format', the value must be in {list(OUTPUT_FORMATS)}, "
                         f"but got '{value}'.")
    return value.lower()


def gitlab_path(fmt: str, gitlab_report=None):
    """Where the GitLab Code Quality report goes, or None."""
    from objdebug.report import gitlab

    return gitlab_report or (Path(gitlab.DEFAULT_PATH) if fmt == "gitlab" else None)


def ci_annotations(report: dict[str, Any], fmt: str) -> str:
    """The CI annotation lines of a report (GitHub's `::error ...`), one per line; '' for text."""
    from objdebug.report import github

    return "".join(line + "\n" for line in github.annotations(report)) if fmt == "github" else ""


def ci_output(report: dict[str, Any], fmt: str, echo: Callable[[str], None]) -> None:
    """The CI-native output of a report: GitHub annotations through `echo` + the job summary."""
    from objdebug.report import github

    if fmt == "github":
        for line in github.annotations(report):
            echo(line)
        github.append_summary(report)


@dataclass
class Request:
    """One command's options (the CLI's flags, by keyword)."""

    stages: list[str] | None = None
    config: Path | None = None
    demo: bool = False
    set_: list[str] | None = None
    device: str | None = None
    mode: str | None = None
    seed: int | None = None
    checkpoint: str | None = None
    profile: str | None = None
    json_path: Path | None = None
    out: Path | None = None
    strict: bool = False
    debug: bool = False
    select: list[str] | None = None
    ignore: list[str] | None = None
    verbose: bool = False
    junit: Path | None = None
    junit_warnings_as_skipped: bool = False
    html: Path | None = None
    markdown: Path | None = None
    baseline: Path | None = None
    compile_cache: Path | None = None
    no_cache: bool = False
    quiet: bool = False
    output_format_: str | None = None
    gitlab_report: Path | None = None
    workers: int | None = None
    expect_trained: bool = False
    timeout: float | None = None  # seconds; None: the profile's `timeout`
    show: int | None = None  # `objdebug batches --show N`: print N real rows instead of running
    settings: dict[str, Any] = field(default_factory=dict)  # --synthesize, --batch-size, --samples

    @classmethod
    def of(cls, **opts: Any) -> Request:
        """A request from a command's keywords; those it has no field for are stage settings."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in opts.items() if k in names},
                   settings={k: v for k, v in opts.items() if k not in names})

    def options(self) -> dict[str, Any]:
        return {**self.settings, **({"expect_trained": True} if self.expect_trained else {})}


@dataclass
class Prepared:
    fmt: str
    config: Config
    profile: Profile
    baseline: dict[str, Any] | None


def prepare(req: Request) -> Prepared:
    """Everything that can be wrong before any work: format, config, profile, output paths (none
    may replace an input or another output, all must be writable), the baseline."""
    from objdebug.core import outputs
    from objdebug.pipeline import baseline as baseline_mod

    if req.timeout is not None and not (0 <= req.timeout < float("inf")):
        raise InputError(f"For '--timeout', the value must be a number of seconds >= 0, but got "
                         f"{req.timeout}.")
    if req.workers is not None and req.workers < 1:
        raise InputError(f"For '--workers', the value must be >= 1, but got {req.workers}.")
    most = os.cpu_count() or 1  # a worker per core at most: msrun takes any number unchecked
    if req.workers is not None and req.workers > most:
        raise InputError(f"For '--workers', the value must be <= {most} (this machine's CPU "
                         f"count), but got {req.workers}.")
    fmt = output_format(req.output_format_)
    cfg = load(req.config, req.demo, req.set_, req.device, req.mode, req.seed, req.checkpoint)
    prof = load_profile(req.profile or cfg.run.profile)
    if cfg.chat is not None:  # a template that does not render, markers outside the tokenizer: exit 2 now
        from objdebug.pipeline.chat_template import chat_roles

        chat_roles(cfg)
    # a named cache directory is checked like any output; the default one never stops a run
    named_cache = None if req.no_cache else (req.compile_cache or cfg.run.compile_cache)
    outputs.check(outputs.outputs(json=req.json_path, junit=req.junit, html=req.html,
                                  markdown=req.markdown, out=req.out, compile_cache=named_cache,
                                  gitlab=gitlab_path(fmt, req.gitlab_report)),
                  outputs.config_inputs(cfg, prof.source, req.baseline))
    old = baseline_mod.load(str(req.baseline)) if req.baseline else None
    if fmt == "github":
        outputs.check_step_summary(os.environ.get("GITHUB_STEP_SUMMARY"))
    return Prepared(fmt, cfg, prof, old)


def launch(req: Request, argv: list[str]):
    """`--workers N` outside msrun: the request checked (in milliseconds, not after the workers'
    cluster timeout), then N msrun workers run this same command line less `--workers`, within
    the run's time limit (the supervisor's: it ends msrun and every worker with this process).
    Rank 0's reports are committed here, once the whole run ended well: a cancelled, killed or
    failed run leaves none."""
    from objdebug.core.interrupts import Interrupted
    from objdebug.engine import watchdog
    from objdebug.report import ReportSet, commit_staged

    p = prepare(req)
    limit = req.timeout if req.timeout is not None else p.profile.data.get("timeout", 0.0)
    watchdog.timeout(limit)
    res = distributed.launch(distributed.without_workers(argv), req.workers,
                             **({"timeout": limit} if limit else {}))
    written = ReportSet()
    try:
        commit_staged(res.staged, written)
    except Interrupted as exc:  # held until every rename was done: say so
        exc.reports_written = written.committed
        raise
    except BaseException:
        distributed.discard(res.staged)
        raise
    return res


def execute(req: Request, progress: Progress, echo: Callable[[str], None], colour: bool = False) -> int:
    """Run the request's stages, write its reports (all or none; under msrun only rank 0 writes
    and prints), print the terminal report through `echo`; returns the exit code."""
    from objdebug.core.interrupts import Interrupted
    from objdebug.report import json_report, terminal

    from objdebug.engine import watchdog
    from objdebug.engine.cache_fallback import in_fallback

    if req.show is not None:
        return show_batches(req, echo, colour)
    p = prepare(req)
    watchdog.timeout(req.timeout if req.timeout is not None else p.profile.data.get("timeout", 0.0))
    no_cache = req.no_cache or in_fallback()  # the rerun after a graph the cache cannot save
    cache = False if no_cache else (str(req.compile_cache.resolve()) if req.compile_cache else True)
    result = run(p.config, stages=req.stages, profile=p.profile, options=req.options(),
                 out_dir=str(req.out.resolve()) if req.out else None, strict=req.strict,
                 select=req.select, ignore=req.ignore, debug=req.debug, progress=progress,
                 compile_cache=cache, baseline=p.baseline)
    report = json_report.to_dict(result)
    leader = distributed.world().leader
    text = (terminal.final_line(report, colour) if req.quiet
            else terminal.render(report, colour=colour, verbose=req.verbose).rstrip("\n"))
    written = None
    try:
        # under objdebug's launcher rank 0 leaves its reports as temporaries, which the launcher
        # renames once every worker ended well: a cancelled or killed job writes no report
        handed = distributed.launched() and distributed.world().distributed
        if leader:  # the run's report files: all replaced, or none
            written = write_reports(report, json=req.json_path, junit=req.junit,
                                    junit_warnings_as_skipped=req.junit_warnings_as_skipped,
                                    html=req.html, markdown=req.markdown,
                                    gitlab=gitlab_path(p.fmt, req.gitlab_report), commit=not handed)
        distributed.record_exit(result.exit_code, report_text=text + "\n" +
                                ci_annotations(report, p.fmt) if leader else None,
                                staged=written.staged if written else None)
        if leader:
            echo(text)
            ci_output(report, p.fmt, echo)
        watchdog.said(result.exit_code)  # the verdict is out: a slow exit is not a time-out
    except Interrupted as exc:
        exc.after, exc.during = (result.stages or ["setup"])[-1], "report writing"
        exc.reports_written = bool(written and written.committed)
        raise
    return result.exit_code


def show_batches(req: Request, echo: Callable[[str], None], colour: bool = False) -> int:
    """`objdebug batches --show N`: the first N rows of `[data] batches`, token by token, marked
    trained / ignored / padding / wrong-label as measured on the real objective (the batches
    stage's own measurement, stages/batches/audit.py); wrapped to the terminal's width."""
    import shutil

    from objdebug.engine import runtime
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target
    from objdebug.pipeline.context import Context
    from objdebug.stages.batches import audit, show

    if req.show < 1:
        raise InputError(f"For '--show', the value must be a number of rows >= 1, but got {req.show}.")
    p = prepare(req)
    if p.config.data.batches is None:
        raise InputError("For '--show', [data] batches must name the pipeline's batches, but it is "
                         "not set (docs/config.md: your pipeline's batches).", source=p.config.source)
    runtime.setup(p.config.run.device, p.config.run.mode, p.config.run.seed)
    with runtime.scratch_dir():
        target = load_target(p.config)
        engine = Engine(target, batch_size=p.profile.section("engine")["batch_size"])
        ctx = Context(config=p.config, target=target, engine=engine, profile=p.profile)
        measured = audit.audit(ctx, p.profile.section("batches"))
        roles = show.chat_rows(ctx, p.profile.section("batches"))  # [chat]: each token's turn and role
    echo(show.render(measured, req.show, show.decoder(p.config),
                     shutil.get_terminal_size().columns, colour, roles=roles))
    return 0


def render(result_json: Path, *, html=None, markdown=None, junit=None,
           junit_warnings_as_skipped: bool = False, verbose: bool = False,
           output_format_: str | None = None, gitlab_report=None,
           echo: Callable[[str], None] = print, colour: bool = False) -> None:
    """`objdebug render`: a saved JSON report re-rendered (terminal, and the report files). A
    field the structure check does not cover, missing or of the wrong type, is the saved report's
    problem (exit 2 naming it), not objdebug's; the files are all-or-nothing."""
    from objdebug.core import outputs
    from objdebug.report import github, json_report, terminal

    fmt = output_format(output_format_)
    outputs.check(outputs.outputs(junit=junit, html=html, markdown=markdown,
                                  gitlab=gitlab_path(fmt, gitlab_report)),
                  [("the report being rendered", outputs.resolve(result_json))])
    report = json_report.load(str(result_json), renderable=True)
    if fmt == "github":
        outputs.check_step_summary(os.environ.get("GITHUB_STEP_SUMMARY"))
    with _malformed_report(str(result_json)):
        write_reports(report, junit=junit, junit_warnings_as_skipped=junit_warnings_as_skipped,
                      html=html, markdown=markdown, gitlab=gitlab_path(fmt, gitlab_report))
        text = terminal.render(report, colour=colour, verbose=verbose)
        if fmt == "github":  # what ci_output prints, tried before anything is printed
            ci_annotations(report, fmt), github.summary(report)
    echo(text.removesuffix("\n"))
    ci_output(report, fmt, echo)


@contextlib.contextmanager
def _malformed_report(path: str):
    """A KeyError/TypeError/... while rendering a saved report -> InputError naming the file
    (--debug shows the traceback of the InputError's cause)."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
        what = f"no field {exc.args[0]!r}" if isinstance(exc, KeyError) and exc.args else \
            f"{type(exc).__name__}: {exc}"
        raise InputError(f"not a well-formed objdebug report: {what}", source=path) from exc


def explain(code: str) -> str:
    """`objdebug explain CODE`: the rule's page; an unknown code is an input error."""
    from objdebug.rules import all_rules, render_rule

    rule = all_rules().get(code.upper())
    if rule is None:
        raise InputError(f"For 'explain', the code must be one of {sorted(all_rules())}, but got '{code}'.")
    return render_rule(rule)


def rules_table() -> str:
    """`objdebug rules`: every code, its stage, name and summary."""
    from tabulate import tabulate

    from objdebug.rules import all_rules

    rows = [[r.code, r.stage, r.name, r.summary] for r in all_rules().values()]
    return tabulate(rows, headers=["code", "stage", "name", "summary"], tablefmt="simple")


def monitor_log(log: str | Path, colour: bool = False) -> tuple[str, int]:
    """`objdebug monitor-log`: a training-monitor log rendered with its verdicts, and its exit code."""
    from objdebug import monitor

    rep = monitor.report(str(log))
    return monitor.render_report(rep, colour=colour), rep["exit_code"]
