"""The `objdebug` command: parse, call the library, render, map to exit codes.

Exit codes: 0 all checks pass, 1 a check failed, 2 usage/config/input error, 3 internal error.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import traceback
from pathlib import Path
from typing import Annotated, Any, Optional

_USER_GLOG = os.environ.get("GLOG_v")  # a user's own MindSpore log level is kept
os.environ.setdefault("GLOG_v", "3")

import typer  # noqa: E402

from objdebug.errors import EXIT_INPUT_ERROR, EXIT_INTERNAL_ERROR, InputError  # noqa: E402

app = typer.Typer(
    name="objdebug",
    help="Diagnose a MindSpore training objective: align, grad, invariants, decompose, correlate, preference, stress.",
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
)

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help="objdebug.toml (default: ./objdebug.toml or pyproject.toml [tool.objdebug]).")]
DemoOpt = Annotated[bool, typer.Option("--demo", help="Use the bundled demo target.")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override a config key: section.key=value (repeatable).")]
DeviceOpt = Annotated[Optional[str], typer.Option("--device", help="CPU, GPU or Ascend (overrides run.device).")]
ModeOpt = Annotated[Optional[str], typer.Option("--mode", help="graph (default) or pynative.")]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Overrides run.seed.")]
CkptOpt = Annotated[Optional[str], typer.Option("--checkpoint", help="Overrides model.checkpoint.")]
ProfileOpt = Annotated[Optional[str], typer.Option("--profile", "-p", help="Profile name in checks/ or a .toml path.")]
JsonOpt = Annotated[Optional[Path], typer.Option("--json", help="Write the JSON report here (atomically).")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="Directory for figures and artefacts.")]
StrictOpt = Annotated[bool, typer.Option("--strict", help="Warnings fail the run (exit 1).")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks.")]
SelectOpt = Annotated[Optional[list[str]], typer.Option("--select", help="Keep only findings whose code starts with this (repeatable).")]
IgnoreOpt = Annotated[Optional[list[str]], typer.Option("--ignore", help="Drop findings whose code starts with this (repeatable).")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Show passing findings in detail too.")]
SynthOpt = Annotated[bool, typer.Option("--synthesize", help="align: generate medium/bad counterparts for rows with only 'good'.")]
BatchOpt = Annotated[Optional[int], typer.Option("--batch-size", help="grad: rows per gradient batch.")]
SamplesOpt = Annotated[Optional[int], typer.Option("--samples", help="grad/decompose: how many data rows to use.")]
JunitOpt = Annotated[Optional[Path], typer.Option("--junit", help="Write a JUnit XML report here (one testsuite per stage).")]
JunitSkipOpt = Annotated[bool, typer.Option("--junit-warnings-as-skipped", help="JUnit: report WARN findings as skipped instead of failures.")]
HtmlOpt = Annotated[Optional[Path], typer.Option("--html", help="Write a self-contained HTML report (DIR/index.html, figures inlined).")]
MarkdownOpt = Annotated[Optional[Path], typer.Option("--markdown", help="Write a Markdown report (DIR/report.md) with PNG figures beside it.")]
CacheOpt = Annotated[Optional[Path], typer.Option("--compile-cache", help="MindSpore compile cache in this directory instead of ./.objdebug_cache (one sub-folder per target, profile and shape set; checked graph by graph). Speeds up a repeated run.")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="No compile cache: neither read nor write .objdebug_cache/ (or --compile-cache, run.compile_cache); also OBJDEBUG_NO_CACHE=1.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="Print only the final verdict line (no progress display, no table).")]
FormatOpt = Annotated[Optional[str], typer.Option("--output-format", help="text, github or gitlab (default: github under GitHub Actions, else text). github: annotations on stdout + the Markdown report appended to $GITHUB_STEP_SUMMARY; gitlab: a Code Quality JSON report (--gitlab-report).")]
GitlabOpt = Annotated[Optional[Path], typer.Option("--gitlab-report", help="Write a GitLab Code Quality JSON report here (default with --output-format gitlab: gl-code-quality-report.json).")]
WorkersOpt = Annotated[Optional[int], typer.Option("--workers", help="Run N workers through MindSpore's msrun on this machine; rows are sharded, results combined with collectives (docs/distributed.md).")]
ExpectTrainedOpt = Annotated[bool, typer.Option("--expect-trained", help="The model is trained: never treat it as untrained (quality checks are judged even at loss ~ log V; see OBJ004).")]
TimeoutOpt = Annotated[Optional[float], typer.Option("--timeout", help="End the run after this many seconds with exit 3, naming the graph being compiled (default: the profile's timeout; 0: none).")]
BaselineOpt = Annotated[Optional[Path], typer.Option("--baseline", help="An earlier JSON report: regressions against it are findings (OBJ0xx).")]


def _fail(message: str, code: int) -> None:
    from objdebug.distributed import record_exit

    record_exit(code, message)  # a launched worker tells the launcher (no-op otherwise)
    typer.echo(f"objdebug: error: {message}", err=True)
    raise typer.Exit(code)


def _launch_workers(workers: int, debug: bool) -> None:
    """`--workers N` outside msrun: start N workers running this same command, then report."""
    from objdebug.distributed import launch

    args, skip = [], False
    for a in sys.argv[1:]:  # the same command line, less --workers
        if skip:
            skip = False
        elif a == "--workers":
            skip = True
        elif not a.startswith("--workers="):
            args.append(a)
    res = guarded(debug, launch, args, workers)
    if res.failed or res.code >= EXIT_INPUT_ERROR:
        _fail(res.output, res.code)
    typer.echo(res.output, nl=False)
    raise typer.Exit(res.code)


def _quiet_mindspore(debug: bool) -> None:
    """MindSpore's own `[ERROR]` log lines (a missing libcuda for `--device GPU`, a compile
    failure's dump) reach the terminal only under --debug; objdebug reports the error itself in one
    line. Takes effect when MindSpore is first imported, which the commands do lazily."""
    if _USER_GLOG is None:
        from objdebug.engine.runtime import quiet_mindspore

        os.environ["GLOG_v"] = "3" if debug else "4"  # 4: CRITICAL only
        quiet_mindspore(not debug)


def guarded(debug: bool, fn, *args, **kwargs):
    """Run fn; InputError -> exit 2 with one line, anything else -> exit 3 (traceback with --debug);
    SIGINT/SIGTERM -> one line and exit 130/143, after every cleanup ran."""
    from objdebug.engine.cache_fallback import CacheUnusable, caused_by_cache, rerun_without_cache
    from objdebug.engine.exit_guard import user_exits
    from objdebug.interrupts import Interrupted, raising_signals, swallowed

    _quiet_mindspore(debug)
    try:
        with raising_signals(), user_exits():  # the target's sys.exit(0) is not a pass
            try:
                return fn(*args, **kwargs)
            except (Exception, KeyboardInterrupt) as exc:  # a signal that someone turned into an error
                if swallowed() is not None and not isinstance(exc, Interrupted):
                    raise swallowed() from None
                raise
    except typer.Exit:
        raise
    except CacheUnusable as exc:  # the cache, not the target: the same command, cache off
        rerun_without_cache(exc.graph)
    except InputError as exc:
        if caused_by_cache(exc):
            rerun_without_cache("?")
        if debug:
            traceback.print_exc()
            if getattr(exc, "detail", None):  # e.g. MindSpore's full compile error
                typer.echo(exc.detail, err=True)
        _fail(str(exc), EXIT_INPUT_ERROR)
    except Interrupted as exc:
        written = "reports written" if getattr(exc, "reports_written", False) else "no report written"
        _fail(f"interrupted{exc.where()}; {written}", exc.exit_code)
    except KeyboardInterrupt:  # a ^C outside raising_signals (another thread's handler)
        _fail("interrupted; no report written", 130)
    except Exception as exc:
        if debug:
            traceback.print_exc()
            _fail(f"internal error: {type(exc).__name__}: {exc}", EXIT_INTERNAL_ERROR)
        first = (str(exc).strip().splitlines() or [""])[0]
        _fail(f"internal error: {type(exc).__name__}: {first} (run with --debug for the traceback)",
              EXIT_INTERNAL_ERROR)


@contextlib.contextmanager
def malformed_report(path: str, debug: bool):
    """A KeyError/TypeError/... while rendering a saved report -> InputError naming the file."""
    try:
        yield
    except (KeyError, TypeError, AttributeError, IndexError, ValueError) as exc:
        if debug:
            traceback.print_exc()
        what = f"no field {exc.args[0]!r}" if isinstance(exc, KeyError) and exc.args else \
            f"{type(exc).__name__}: {exc}"
        raise InputError(f"not a well-formed objdebug report: {what}", source=path) from None


def _load(config, demo, sets, device, mode, seed, checkpoint):
    from objdebug.config import load_config, parse_override

    overrides, origins = {}, {}  # origins: an error in an overridden key names the command line
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


def ci_output(report, fmt: str) -> None:
    """The CI-native output of a report: GitHub annotations on stdout + the job summary."""
    from objdebug.report import github

    if fmt == "github":
        for line in github.annotations(report):
            typer.echo(line)
        github.append_summary(report)


def ci_annotations(report, fmt: str) -> str:
    """The annotation lines ci_output prints (a launched worker hands them to the launcher)."""
    from objdebug.report import github

    return "".join(line + "\n" for line in github.annotations(report)) if fmt == "github" else ""


def execute(*, stages, config=None, demo=False, set_=None, device=None, mode=None, seed=None,
            checkpoint=None, profile=None, json_path=None, out=None, strict=False, debug=False,
            select=None, ignore=None, verbose=False, junit=None, junit_warnings_as_skipped=False,
            html=None, markdown=None, baseline=None, compile_cache=None, no_cache=False,
            quiet=False, output_format_=None, gitlab_report=None, workers=None,
            expect_trained=False, timeout=None, **settings) -> None:
    """Shared body of `run`, `demo` and the stage commands: one keyword per shared option;
    `settings` are the stage settings a command takes (--synthesize, --batch-size, --samples)."""
    from objdebug import distributed

    options = {**settings, **({"expect_trained": True} if expect_trained else {})}
    from objdebug.engine.cache_fallback import in_fallback

    no_cache = no_cache or in_fallback()  # rerun after a graph the cache cannot save
    if timeout is not None and not (timeout >= 0 and timeout < float("inf")):
        _fail(f"For '--timeout', the value must be a number of seconds >= 0, but got {timeout}.",
              EXIT_INPUT_ERROR)
    if workers is not None and workers < 1:
        _fail(f"For '--workers', the value must be >= 1, but got {workers}.", EXIT_INPUT_ERROR)
    most = os.cpu_count() or 1  # a worker per core at most: msrun takes any number unchecked
    if workers is not None and workers > most:
        _fail(f"For '--workers', the value must be <= {most} (this machine's CPU count), but got "
              f"{workers}.", EXIT_INPUT_ERROR)
    def prepare():
        """Everything that can be wrong before any work: format, config, profile, output paths
        (none may replace an input or another output, all must be writable), the baseline."""
        from objdebug import baseline as baseline_mod
        from objdebug import outputs
        from objdebug.profile import load_profile

        fmt = output_format(output_format_)
        cfg = _load(config, demo, set_, device, mode, seed, checkpoint)
        prof = load_profile(profile or cfg.run.profile)
        # a named cache directory is checked like any output; the default one never stops a run
        named_cache = None if no_cache else (compile_cache or cfg.run.compile_cache)
        outputs.check(outputs.outputs(json=json_path, junit=junit, html=html, markdown=markdown,
                                      out=out, compile_cache=named_cache,
                                      gitlab=gitlab_path(fmt, gitlab_report)),
                      outputs.config_inputs(cfg, prof.source, baseline))
        old = baseline_mod.load(str(baseline)) if baseline else None
        if fmt == "github":
            outputs.check_step_summary(os.environ.get("GITHUB_STEP_SUMMARY"))
        return fmt, cfg, prof, old

    if workers and workers > 1 and not distributed.under_msrun():
        guarded(debug, prepare)  # in milliseconds, not after the workers' cluster timeout
        _launch_workers(workers, debug)

    def body():
        from objdebug.engine import watchdog

        fmt, cfg, prof, old = prepare()
        watchdog.timeout(timeout if timeout is not None else prof.data.get("timeout", 0.0))
        run_and_report(fmt, cfg, prof, old)

    def run_and_report(fmt, cfg, prof, old):
        from objdebug import api
        from objdebug.interrupts import Interrupted
        from objdebug.progress import for_stream
        from objdebug.report import json_report, terminal

        cache = False if no_cache else (str(compile_cache.resolve()) if compile_cache else True)
        result = api.run(cfg, stages=stages, profile=prof, options=options,
                         out_dir=str(out.resolve()) if out else None, strict=strict,
                         select=select, ignore=ignore, debug=debug,
                         progress=for_stream(sys.stderr, quiet=quiet), compile_cache=cache,
                         baseline=old)
        report = json_report.to_dict(result)
        leader = distributed.world().leader  # under msrun only rank 0 writes and prints
        colour = sys.stdout.isatty()
        text = (terminal.final_line(report, colour) if quiet
                else terminal.render(report, colour=colour, verbose=verbose).rstrip("\n"))
        written = None
        try:
            if leader:  # the run's report files: all replaced, or none
                written = api.write_reports(report, json=json_path, junit=junit,
                                            junit_warnings_as_skipped=junit_warnings_as_skipped,
                                            html=html, markdown=markdown,
                                            gitlab=gitlab_path(fmt, gitlab_report))
            distributed.record_exit(result.exit_code, report_text=text + "\n" +
                                    ci_annotations(report, fmt) if leader else None)
            if leader:
                typer.echo(text)
                ci_output(report, fmt)
        except Interrupted as exc:
            exc.after, exc.during = (result.stages or ["setup"])[-1], "report writing"
            exc.reports_written = bool(written and written.committed)
            raise
        raise typer.Exit(result.exit_code)

    guarded(debug, body)


# --------------------------------------------------------------------------- shared options
# Every option that several commands take, once: name of the keyword -> (annotated type, default).
# A command lists the names it takes (with_options); its order is the order of `--help`.
OPTIONS: dict[str, tuple[Any, Any]] = {
    "config": (ConfigOpt, None), "demo": (DemoOpt, False), "set_": (SetOpt, None),
    "device": (DeviceOpt, None), "mode": (ModeOpt, None), "seed": (SeedOpt, None),
    "checkpoint": (CkptOpt, None), "profile": (ProfileOpt, None), "json_path": (JsonOpt, None),
    "out": (OutOpt, None), "strict": (StrictOpt, False), "debug": (DebugOpt, False),
    "select": (SelectOpt, None), "ignore": (IgnoreOpt, None), "verbose": (VerboseOpt, False),
    "synthesize": (SynthOpt, False), "batch_size": (BatchOpt, None), "samples": (SamplesOpt, None),
    "junit": (JunitOpt, None), "junit_warnings_as_skipped": (JunitSkipOpt, False),
    "html": (HtmlOpt, None), "markdown": (MarkdownOpt, None), "baseline": (BaselineOpt, None),
    "compile_cache": (CacheOpt, None), "no_cache": (NoCacheOpt, False), "quiet": (QuietOpt, False),
    "output_format_": (FormatOpt, None), "gitlab_report": (GitlabOpt, None),
    "workers": (WorkersOpt, None), "expect_trained": (ExpectTrainedOpt, False),
    "timeout": (TimeoutOpt, None),
}
# what `run` and each stage command take
RUN_OPTIONS = ("config", "demo", "set_", "device", "mode", "seed", "checkpoint", "profile",
               "json_path", "out", "strict", "debug", "select", "ignore", "verbose", "synthesize",
               "batch_size", "samples", "junit", "junit_warnings_as_skipped", "html", "markdown",
               "baseline", "compile_cache", "no_cache", "quiet", "output_format_", "gitlab_report",
               "workers", "expect_trained", "timeout")
DEMO_OPTIONS = ("json_path", "out", "profile", "debug", "verbose", "junit", "html", "markdown",
                "compile_cache", "no_cache", "quiet", "output_format_", "gitlab_report", "workers",
                "timeout")
RENDER_OPTIONS = ("html", "markdown", "junit", "junit_warnings_as_skipped", "verbose", "debug",
                  "output_format_", "gitlab_report")


def with_options(*names: str):
    """Give a command the shared options `names`: a parameter of the command with such a name
    gets the shared option's type and help, the others follow its own parameters (through
    **kwargs). Typer reads the signature; the command receives keywords."""
    def decorate(fn):
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values()
               if p.kind is not inspect.Parameter.VAR_KEYWORD]
        own = [p.replace(annotation=OPTIONS[p.name][0], default=OPTIONS[p.name][1])
               if p.name in names else p for p in own]
        declared = {p.name for p in own}
        shared = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=OPTIONS[n][0],
                                    default=OPTIONS[n][1]) for n in names if n not in declared]

        @functools.wraps(fn)
        def command(**kwargs):
            return fn(**kwargs)

        command.__signature__ = inspect.Signature(own + shared)
        command.__annotations__ = {p.name: p.annotation for p in own + shared}
        return command
    return decorate


def _stage_command(stage: str, doc: str):
    @with_options(*RUN_OPTIONS)
    def command(**opts) -> None:
        execute(stages=[stage], **opts)

    command.__doc__ = doc
    return command


from objdebug.stages import REGISTRY as _STAGES  # noqa: E402  (data only: no MindSpore)

for _stage in _STAGES:
    app.command(name=_stage.name, help=_stage.summary)(_stage_command(_stage.name, _stage.summary))


@app.command()
@with_options(*RUN_OPTIONS)
def run(
    stages: Annotated[Optional[str], typer.Option("--stages", help="Comma-separated stages (default: the profile's).")] = None,
    **opts,
) -> None:
    """Run the pipeline (all stages, or --stages) on one target: the CI gate."""
    chosen = [s.strip() for s in stages.split(",") if s.strip()] if stages else None
    execute(stages=chosen, **opts)


@app.command()
@with_options(*DEMO_OPTIONS)
def demo(**opts) -> None:
    """Run every stage on the bundled demo target (a tiny causal LM trained by this project)."""
    execute(stages=None, demo=True, **opts)


@app.command()
@with_options(*RENDER_OPTIONS)
def render(
    result_json: Annotated[Path, typer.Argument(help="A JSON report written by --json.")],
    html=None, markdown=None, junit=None, junit_warnings_as_skipped=False, verbose=False,
    debug=False, output_format_=None, gitlab_report=None,
) -> None:
    """Re-render a saved JSON report (terminal, and --html/--markdown/--junit files); exit 0 once written."""
    def body():
        from objdebug import api, outputs
        from objdebug.report import json_report, terminal

        fmt = output_format(output_format_)
        outputs.check(outputs.outputs(junit=junit, html=html, markdown=markdown,
                                      gitlab=gitlab_path(fmt, gitlab_report)),
                      [("the report being rendered", outputs.resolve(result_json))])
        report = json_report.load(str(result_json), renderable=True)
        if fmt == "github":
            outputs.check_step_summary(os.environ.get("GITHUB_STEP_SUMMARY"))
        # a field the structure check does not cover, missing or of the wrong type, is the saved
        # report's problem (exit 2 naming it), not objdebug's; the files are all-or-nothing
        with malformed_report(str(result_json), debug):
            api.write_reports(report, junit=junit, junit_warnings_as_skipped=junit_warnings_as_skipped,
                              html=html, markdown=markdown, gitlab=gitlab_path(fmt, gitlab_report))
            text = terminal.render(report, colour=sys.stdout.isatty(), verbose=verbose)
            if fmt == "github":  # what ci_output prints, tried before anything is printed
                from objdebug.report import github

                ci_annotations(report, fmt), github.summary(report)
        typer.echo(text, nl=False)
        ci_output(report, fmt)

    guarded(debug, body)


@app.command()
def explain(code: Annotated[str, typer.Argument(help="A finding code, e.g. OBJ101.")]) -> None:
    """Print a finding's page: what it checks, why it matters, how to fix it."""
    from objdebug.rules import all_rules, render_rule

    rule = all_rules().get(code.upper())
    if rule is None:
        _fail(f"For 'explain', the code must be one of {sorted(all_rules())}, but got '{code}'.",
              EXIT_INPUT_ERROR)
    typer.echo(render_rule(rule))


@app.command("rules")
def list_rules() -> None:
    """List every finding code."""
    from tabulate import tabulate

    from objdebug.rules import all_rules

    rows = [[r.code, r.stage, r.name, r.summary] for r in all_rules().values()]
    typer.echo(tabulate(rows, headers=["code", "stage", "name", "summary"], tablefmt="simple"))


LogArg = Annotated[Path, typer.Argument(help="A training-monitor JSONL log (objdebug.monitor).")]


@app.command("monitor-log")
def monitor_log(log: LogArg, debug: DebugOpt = False) -> None:
    """Render a training-monitor log with its verdicts; exit 1 if a failure was recorded."""
    def body():
        from objdebug import monitor

        rep = monitor.report(str(log))
        typer.echo(monitor.render_report(rep, colour=sys.stdout.isatty()), nl=False)
        raise typer.Exit(rep["exit_code"])

    guarded(debug, body)


@app.command("report", hidden=True)
def report_log(log: LogArg, debug: DebugOpt = False) -> None:
    """Deprecated name of `monitor-log` (it renders a training log, not a run's report)."""
    typer.echo("objdebug: 'objdebug report' is deprecated; use 'objdebug monitor-log'.", err=True)
    monitor_log(log, debug)


@app.command("init")
def init_command(
    model: Annotated[str, typer.Option("--model", help="The model factory, 'pkg.module:build'.")],
    objective: Annotated[str, typer.Option("--objective", help="The objective factory, 'pkg.losses:Loss'.")],
    checkpoint: Annotated[Optional[Path], typer.Option("--checkpoint", help="The model's checkpoint, loaded strictly.")] = None,
    data: Annotated[Optional[list[Path]], typer.Option("--data", help="A data file (align, scores, preference or text rows); repeatable.")] = None,
    tokenizer: Annotated[Optional[str], typer.Option("--tokenizer", help="A tokenizer.json (default: UTF-8 bytes).")] = None,
    output: Annotated[Path, typer.Option("--output", help="The config to write; never overwritten.")] = Path("objdebug.toml"),
    device: Annotated[str, typer.Option("--device", help="CPU, GPU or Ascend.")] = "CPU",
    max_probe_length: Annotated[int, typer.Option("--max-probe-length", help="Longest input tried when the model names no position table.")] = 2048,
    model_kwargs: Annotated[Optional[str], typer.Option("--model-kwargs", help="Model factory kwargs as a TOML inline table, over its defaults.")] = None,
    debug: DebugOpt = False,
) -> None:
    """Write a commented objdebug.toml: probe the model and objective, fill what can be detected."""
    def body():
        from objdebug.init import init_config

        raise typer.Exit(init_config(model, objective, str(checkpoint) if checkpoint else None,
                                     [str(p) for p in data or []], tokenizer, str(output), device,
                                     max_probe_length, model_kwargs, echo=typer.echo))

    guarded(debug, body)


def main() -> None:
    from objdebug.distributed import serve_if_scheduler

    try:  # every path below is resolved against it; MindSpore aborts (rc 134) without one
        os.getcwd()
    except FileNotFoundError:
        typer.echo("objdebug: error: the working directory no longer exists (it was deleted); "
                   "cd to an existing directory", err=True)
        raise SystemExit(EXIT_INPUT_ERROR) from None
    serve_if_scheduler()  # under msrun, the scheduler process only builds the cluster
    from objdebug.supervisor import supervise

    supervise()  # the command runs in a child: no hang, no pass without a verdict (issue 23)
    app()


if __name__ == "__main__":
    main()
