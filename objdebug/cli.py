"""The `objdebug` command: parse, call the library (objdebug.api), print, map to exit codes:
0 all checks pass, 1 a check failed, 2 usage/config/input error, 3 internal error."""

from __future__ import annotations

import functools
import inspect
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from objdebug.core import exits  # no MindSpore: the command builds its help without it
from objdebug.core.errors import EXIT_INPUT_ERROR
from objdebug.core.interrupts import raising_signals

_USER_GLOG = os.environ.get("GLOG_v")  # a user's own MindSpore log level is kept (read, not set)

app = typer.Typer(name="objdebug", add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                  help="Diagnose a MindSpore training objective: align, grad, invariants, decompose, correlate, preference, stress.")


def _fail(message: str, code: int) -> None:
    from objdebug.engine import distributed, watchdog

    distributed.record_exit(code, message)  # a launched worker tells the launcher (no-op otherwise)
    typer.echo(f"objdebug: error: {message}", err=True)
    watchdog.said(code)  # the supervisor adds no line of its own if the exit is slow
    raise typer.Exit(code)


def guarded(debug: bool, fn, *args, **kwargs):
    """Run fn; an input error -> exit 2 with one line, anything else -> exit 3 (traceback with
    --debug); SIGINT/SIGTERM -> one line and exit 130/143, after every cleanup ran."""
    from objdebug.engine.cache_fallback import rerun_when_the_cache_fails
    from objdebug.engine.exit_guard import user_exits
    from objdebug.engine.runtime import quiet_logs

    quiet_logs(debug, _USER_GLOG)
    try:  # the target's sys.exit(0) is not a pass; a graph the cache cannot save costs a rerun
        with rerun_when_the_cache_fails(), raising_signals(), user_exits(), exits.signals_first():
            return fn(*args, **kwargs)
    except typer.Exit:
        raise
    except exits.ENDINGS as exc:
        code, message = exits.ending(exc, debug)
        _fail(message, code)


def execute(*, stages, debug=False, workers=None, quiet=False, **opts) -> None:
    """Shared body of `run`, `demo` and the stage commands: the options as an api.Request."""
    from objdebug import api
    from objdebug.engine import distributed

    req = api.Request.of(stages=stages, debug=debug, workers=workers, quiet=quiet, **opts)
    if workers and workers > 1 and not distributed.under_msrun():  # N workers run this command
        res = guarded(debug, api.launch, req, sys.argv[1:])
        if res.failed or res.code >= EXIT_INPUT_ERROR:
            _fail(res.output, res.code)
        typer.echo(res.output, nl=False)
        raise typer.Exit(res.code)
    from objdebug.core.progress import for_stream

    raise typer.Exit(guarded(debug, api.execute, req, for_stream(sys.stderr, quiet=quiet),
                             typer.echo, sys.stdout.isatty()))


# --------------------------------------------------------------------------- shared options
# Every option that several commands take, once: keyword -> Annotated type and default. A
# command lists the names it takes (with_options); its order is the order of `--help`.
def _opt(kind, default, *flags, help):
    return Annotated[kind, typer.Option(*flags, help=help)], default


OPTIONS: dict[str, tuple[Any, Any]] = {
    "config": _opt(Optional[Path], None, "--config", "-c", help="objdebug.toml (default: ./objdebug.toml or pyproject.toml [tool.objdebug])."),
    "demo": _opt(bool, False, "--demo", help="Use the bundled demo target."),
    "set_": _opt(Optional[list[str]], None, "--set", help="Override a config key: section.key=value (repeatable)."),
    "device": _opt(Optional[str], None, "--device", help="CPU, GPU or Ascend (overrides run.device)."),
    "mode": _opt(Optional[str], None, "--mode", help="graph (default) or pynative."),
    "seed": _opt(Optional[int], None, "--seed", help="Overrides run.seed."),
    "checkpoint": _opt(Optional[str], None, "--checkpoint", help="Overrides model.checkpoint."),
    "profile": _opt(Optional[str], None, "--profile", "-p", help="Profile name in checks/ or a .toml path."),
    "json_path": _opt(Optional[Path], None, "--json", help="Write the JSON report here (atomically)."),
    "out": _opt(Optional[Path], None, "--out", help="Directory for figures and artefacts."),
    "strict": _opt(bool, False, "--strict", help="Warnings fail the run (exit 1)."),
    "debug": _opt(bool, False, "--debug", help="Show tracebacks."),
    "select": _opt(Optional[list[str]], None, "--select", help="Keep only findings whose code starts with this (repeatable)."),
    "ignore": _opt(Optional[list[str]], None, "--ignore", help="Drop findings whose code starts with this (repeatable)."),
    "verbose": _opt(bool, False, "--verbose", "-v", help="List every finding, passes and skip reasons included (by default they are counted per stage)."),
    "synthesize": _opt(bool, False, "--synthesize", help="align: generate medium/bad counterparts for rows with only 'good'."),
    "batch_size": _opt(Optional[int], None, "--batch-size", help="grad: rows per gradient batch."),
    "samples": _opt(Optional[int], None, "--samples", help="grad/decompose: how many data rows to use."),
    "junit": _opt(Optional[Path], None, "--junit", help="Write a JUnit XML report here (one testsuite per stage)."),
    "junit_warnings_as_skipped": _opt(bool, False, "--junit-warnings-as-skipped", help="JUnit: report WARN findings as skipped instead of failures."),
    "html": _opt(Optional[Path], None, "--html", help="Write a self-contained HTML report (DIR/index.html, figures inlined)."),
    "markdown": _opt(Optional[Path], None, "--markdown", help="Write a Markdown report (DIR/report.md) with PNG figures beside it."),
    "baseline": _opt(Optional[Path], None, "--baseline", help="An earlier JSON report: regressions against it are findings (OBJ0xx)."),
    "compile_cache": _opt(Optional[Path], None, "--compile-cache", help="MindSpore compile cache in this directory instead of ./.objdebug_cache (one sub-folder per target, profile and shape set; checked graph by graph). Speeds up a repeated run."),
    "no_cache": _opt(bool, False, "--no-cache", help="No compile cache: neither read nor write .objdebug_cache/ (or --compile-cache, run.compile_cache); also OBJDEBUG_NO_CACHE=1."),
    "quiet": _opt(bool, False, "--quiet", "-q", help="Print only the final verdict line (no progress display, no table)."),
    "output_format_": _opt(Optional[str], None, "--output-format", help="text, github or gitlab (default: github under GitHub Actions, else text). github: annotations on stdout + the Markdown report appended to $GITHUB_STEP_SUMMARY; gitlab: a Code Quality JSON report (--gitlab-report)."),
    "gitlab_report": _opt(Optional[Path], None, "--gitlab-report", help="Write a GitLab Code Quality JSON report here (default with --output-format gitlab: gl-code-quality-report.json)."),
    "workers": _opt(Optional[int], None, "--workers", help="Run N workers through MindSpore's msrun on this machine; rows are sharded, results combined with collectives (docs/distributed.md)."),
    "timeout": _opt(Optional[float], None, "--timeout", help="End the run after this many seconds with exit 3, naming the graph being compiled (default: the profile's timeout; 0: none)."),
    "expect_trained": _opt(bool, False, "--expect-trained", help="The model is trained: never treat it as untrained (quality checks are judged even at loss ~ log V; see OBJ004)."),
    "show": _opt(Optional[int], None, "--show", help="batches: print N real rows as tokens marked trained / ignored / padding / wrong-label (measured on the objective) instead of the checks."),
}
DebugOpt = OPTIONS["debug"][0]
RUN_OPTIONS = tuple(k for k in OPTIONS if k != "show")  # what `run` and each stage command take
DEMO_OPTIONS = ("json_path", "out", "profile", "debug", "verbose", "junit", "html", "markdown",
                "compile_cache", "no_cache", "quiet", "output_format_", "gitlab_report", "workers",
                "timeout")
RENDER_OPTIONS = ("html", "markdown", "junit", "junit_warnings_as_skipped", "verbose", "debug",
                  "output_format_", "gitlab_report")


def with_options(*names: str):
    """Give a command the shared options `names` (typer reads the signature built here)."""
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


from objdebug.pipeline.registry import REGISTRY as _STAGES  # noqa: E402  (data only: no MindSpore)

def _stage_command(stage: str):
    @with_options(*RUN_OPTIONS, *(("show",) if stage == "batches" else ()))
    def command(**opts) -> None:
        execute(stages=[stage], **opts)
    return command


for _stage in _STAGES:  # one command per stage: `objdebug align`, ...
    app.command(name=_stage.name, help=_stage.help)(_stage_command(_stage.name))


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
def demo(task: Annotated[Optional[str], typer.Option("--task", help="classification, tagging or embedding: the demo of a [task] kind (a text classifier, a CRF tagger, an InfoNCE encoder).")] = None, **opts) -> None:
    """Run every stage on the bundled demo target (a tiny causal LM trained by this project)."""
    execute(stages=None, demo=task or True, **opts)


@app.command()
@with_options(*RENDER_OPTIONS)
def render(result_json: Annotated[Path, typer.Argument(help="A JSON report written by --json.")],
           debug=False, **opts) -> None:
    """Re-render a saved JSON report (terminal, and --html/--markdown/--junit files); exit 0 once written."""
    from objdebug import api

    guarded(debug, api.render, result_json, echo=typer.echo, colour=sys.stdout.isatty(), **opts)


@app.command()
def explain(code: Annotated[str, typer.Argument(help="A finding code, e.g. OBJ101.")]) -> None:
    """Print a finding's page: what it checks, why it matters, how to fix it."""
    from objdebug import api

    typer.echo(guarded(False, api.explain, code))


@app.command("rules")
def list_rules() -> None:
    """List every finding code."""
    from objdebug import api

    typer.echo(api.rules_table())


LogArg = Annotated[Path, typer.Argument(help="A training-monitor JSONL log (objdebug.monitor).")]


@app.command("monitor-log")
def monitor_log(log: LogArg, debug: DebugOpt = False) -> None:
    """Render a training-monitor log with its verdicts; exit 1 if a failure was recorded."""
    from objdebug import api

    text, code = guarded(debug, api.monitor_log, log, sys.stdout.isatty())
    typer.echo(text, nl=False)
    raise typer.Exit(code)


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
    batches: Annotated[Optional[str], typer.Option("--batches", help="The pipeline's batches ('pkg.mod:factory', .mindrecord, .jsonl): one is read for [data].")] = None,
    debug: DebugOpt = False,
) -> None:
    """Write a commented objdebug.toml: probe the model and objective, fill what can be detected."""
    from objdebug.init import init_config
    raise typer.Exit(guarded(debug, init_config, model, objective, str(checkpoint) if checkpoint else None,
                             [str(p) for p in data or []], tokenizer, str(output), device,
                             max_probe_length, model_kwargs, batches, echo=typer.echo))


def main() -> None:
    from objdebug import supervisor
    from objdebug.engine.distributed import serve_if_scheduler

    supervisor.require_working_directory()  # MindSpore aborts (rc 134) without one
    serve_if_scheduler()  # under msrun: tied to the launcher; the scheduler only builds the cluster
    supervisor.supervise()  # the command runs in a child: no hang, no pass without a verdict
    app()


if __name__ == "__main__":
    main()
