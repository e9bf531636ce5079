"""The `objdebug` command: parse, call the library, render, map to exit codes.

Exit codes: 0 all checks pass, 1 a check failed, 2 usage/config/input error, 3 internal error.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Annotated, Optional

os.environ.setdefault("GLOG_v", "3")

import typer  # noqa: E402

from objdebug.errors import EXIT_INPUT_ERROR, EXIT_INTERNAL_ERROR, InputError  # noqa: E402

app = typer.Typer(
    name="objdebug",
    help="Diagnose a MindSpore training objective: align, grad, decompose, correlate, stress.",
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
CacheOpt = Annotated[Optional[Path], typer.Option("--compile-cache", help="Opt-in MindSpore compile cache in this directory (one sub-folder per target, profile and shape set; checked graph by graph). Speeds up a repeated run.")]
ExpectTrainedOpt = Annotated[bool, typer.Option("--expect-trained", help="The model is trained: never treat it as untrained (quality checks are judged even at loss ~ log V; see OBJ004).")]
BaselineOpt = Annotated[Optional[Path], typer.Option("--baseline", help="An earlier JSON report: regressions against it are findings (OBJ0xx).")]


def _fail(message: str, code: int) -> None:
    typer.echo(f"objdebug: error: {message}", err=True)
    raise typer.Exit(code)


def guarded(debug: bool, fn, *args, **kwargs):
    """Run fn; InputError -> exit 2 with one line, anything else -> exit 3 (traceback with --debug)."""
    try:
        return fn(*args, **kwargs)
    except typer.Exit:
        raise
    except InputError as exc:
        if debug:
            traceback.print_exc()
        _fail(str(exc), EXIT_INPUT_ERROR)
    except KeyboardInterrupt:
        _fail("interrupted", EXIT_INTERNAL_ERROR)
    except Exception as exc:
        if debug:
            traceback.print_exc()
            _fail(f"internal error: {type(exc).__name__}: {exc}", EXIT_INTERNAL_ERROR)
        first = (str(exc).strip().splitlines() or [""])[0]
        _fail(f"internal error: {type(exc).__name__}: {first} (run with --debug for the traceback)",
              EXIT_INTERNAL_ERROR)


def _load(config, demo, sets, device, mode, seed, checkpoint):
    from objdebug.config import load_config, parse_override

    overrides = dict(parse_override(s) for s in (sets or []))
    checkpoint = str(Path(checkpoint).resolve()) if checkpoint is not None else None
    for key, value in (("run.device", device), ("run.mode", mode), ("run.seed", seed),
                       ("model.checkpoint", checkpoint)):
        if value is not None:
            overrides[key] = value
    return load_config(config, overrides=overrides, demo=demo)


def write_reports(report, *, junit=None, junit_warnings_as_skipped=False, html=None,
                  markdown=None) -> None:
    """The file reports of a report dict (a live run's or a saved one's): same input, same files."""
    from objdebug.report import html as html_report
    from objdebug.report import junit as junit_report
    from objdebug.report import markdown as markdown_report
    from objdebug.report.figures import draw_all

    if junit:
        junit_report.write(report, str(junit), warnings_as_skipped=junit_warnings_as_skipped)
    figures = draw_all(report) if (html or markdown) else None
    if html:
        html_report.write(report, html, figures)
    if markdown:
        markdown_report.write(report, markdown, figures)


def execute(*, stages, config, demo, sets, device, mode, seed, checkpoint, profile, json_path, out,
            strict, debug, select, ignore, verbose, options, junit=None,
            junit_warnings_as_skipped=False, html=None, markdown=None, baseline=None,
            compile_cache=None) -> None:
    """Shared body of `run`, `demo` and the stage commands."""
    def body():
        from objdebug import api
        from objdebug import baseline as baseline_mod
        from objdebug.progress import Progress
        from objdebug.report import json_report, terminal

        cfg = _load(config, demo, sets, device, mode, seed, checkpoint)
        old = baseline_mod.load(str(baseline)) if baseline else None  # a bad baseline fails before the run
        out_dir = str(out.resolve()) if out else None
        result = api.run(cfg, stages=stages, profile=profile, options=options, out_dir=out_dir,
                         strict=strict, select=select, ignore=ignore, debug=debug,
                         progress=Progress(),
                         compile_cache=str(compile_cache.resolve()) if compile_cache else None)
        if old is not None:
            baseline_mod.apply(result, old, select=select, ignore=ignore)
        report = json_report.to_dict(result)
        if json_path:
            json_report.write(result, str(json_path))
        write_reports(report, junit=junit, junit_warnings_as_skipped=junit_warnings_as_skipped,
                      html=html, markdown=markdown)
        typer.echo(terminal.render(report, colour=sys.stdout.isatty(), verbose=verbose), nl=False)
        raise typer.Exit(result.exit_code)

    guarded(debug, body)


def _stage_command(stage: str, doc: str):
    def command(
        config: ConfigOpt = None, demo: DemoOpt = False, set_: SetOpt = None, device: DeviceOpt = None,
        mode: ModeOpt = None, seed: SeedOpt = None, checkpoint: CkptOpt = None,
        profile: ProfileOpt = None, json_path: JsonOpt = None, out: OutOpt = None,
        strict: StrictOpt = False, debug: DebugOpt = False, select: SelectOpt = None,
        ignore: IgnoreOpt = None, verbose: VerboseOpt = False, synthesize: SynthOpt = False,
        batch_size: BatchOpt = None, samples: SamplesOpt = None, junit: JunitOpt = None,
        junit_warnings_as_skipped: JunitSkipOpt = False, html: HtmlOpt = None,
        markdown: MarkdownOpt = None, baseline: BaselineOpt = None, compile_cache: CacheOpt = None,
        expect_trained: ExpectTrainedOpt = False,
    ) -> None:
        execute(stages=[stage], config=config, demo=demo, sets=set_, device=device, mode=mode,
                seed=seed, checkpoint=checkpoint, profile=profile, json_path=json_path, out=out,
                strict=strict, debug=debug, select=select, ignore=ignore, verbose=verbose,
                options={"synthesize": synthesize, "batch_size": batch_size, "samples": samples,
                         **({"expect_trained": True} if expect_trained else {})},
                junit=junit, junit_warnings_as_skipped=junit_warnings_as_skipped, html=html,
                markdown=markdown, baseline=baseline, compile_cache=compile_cache)

    command.__doc__ = doc
    return command


_STAGE_DOCS = {
    "align": "Stage 1: loss must order good < medium < bad answers to the same prompt, with a clear gap.",
    "grad": "Stage 2: gradient health (norms, disconnected/NaN parameters, padding leakage, autodiff vs finite differences).",
    "decompose": "Stage 3: components of a composite loss: shares, dead terms, scale imbalance, gradient share.",
    "correlate": "Stage 4: per-sample loss against human quality scores (Pearson with CI, Spearman, Kendall).",
    "stress": "Stage 5: long inputs, all-padding, garbage ids, fp16, padding invariance.",
}
for _name, _doc in _STAGE_DOCS.items():
    app.command(name=_name, help=_doc)(_stage_command(_name, _doc))


@app.command()
def run(
    stages: Annotated[Optional[str], typer.Option("--stages", help="Comma-separated stages (default: the profile's).")] = None,
    config: ConfigOpt = None, demo: DemoOpt = False, set_: SetOpt = None, device: DeviceOpt = None,
    mode: ModeOpt = None, seed: SeedOpt = None, checkpoint: CkptOpt = None, profile: ProfileOpt = None,
    json_path: JsonOpt = None, out: OutOpt = None, strict: StrictOpt = False, debug: DebugOpt = False,
    select: SelectOpt = None, ignore: IgnoreOpt = None, verbose: VerboseOpt = False,
    synthesize: SynthOpt = False, batch_size: BatchOpt = None, samples: SamplesOpt = None,
    junit: JunitOpt = None, junit_warnings_as_skipped: JunitSkipOpt = False, html: HtmlOpt = None,
    markdown: MarkdownOpt = None, baseline: BaselineOpt = None, compile_cache: CacheOpt = None,
    expect_trained: ExpectTrainedOpt = False,
) -> None:
    """Run the pipeline (all stages, or --stages) on one target: the CI gate."""
    chosen = [s.strip() for s in stages.split(",") if s.strip()] if stages else None
    execute(stages=chosen, config=config, demo=demo, sets=set_, device=device, mode=mode, seed=seed,
            checkpoint=checkpoint, profile=profile, json_path=json_path, out=out, strict=strict,
            debug=debug, select=select, ignore=ignore, verbose=verbose,
            options={"synthesize": synthesize, "batch_size": batch_size, "samples": samples,
                     **({"expect_trained": True} if expect_trained else {})},
            junit=junit, junit_warnings_as_skipped=junit_warnings_as_skipped, html=html,
            markdown=markdown, baseline=baseline, compile_cache=compile_cache)


@app.command()
def demo(
    json_path: JsonOpt = None, out: OutOpt = None, profile: ProfileOpt = None,
    debug: DebugOpt = False, verbose: VerboseOpt = False, junit: JunitOpt = None,
    html: HtmlOpt = None, markdown: MarkdownOpt = None, compile_cache: CacheOpt = None,
) -> None:
    """Run every stage on the bundled demo target (a tiny causal LM trained by this project)."""
    execute(stages=None, config=None, demo=True, sets=None, device=None, mode=None, seed=None,
            checkpoint=None, profile=profile, json_path=json_path, out=out, strict=False, debug=debug,
            select=None, ignore=None, verbose=verbose, options={}, junit=junit, html=html,
            markdown=markdown, compile_cache=compile_cache)


@app.command()
def render(
    result_json: Annotated[Path, typer.Argument(help="A JSON report written by --json.")],
    html: HtmlOpt = None, markdown: MarkdownOpt = None, junit: JunitOpt = None,
    junit_warnings_as_skipped: JunitSkipOpt = False, verbose: VerboseOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Re-render a saved JSON report (terminal, and --html/--markdown/--junit files); exit 0 once written."""
    def body():
        from objdebug.report import json_report, terminal

        report = json_report.load(str(result_json))
        write_reports(report, junit=junit, junit_warnings_as_skipped=junit_warnings_as_skipped,
                      html=html, markdown=markdown)
        typer.echo(terminal.render(report, colour=sys.stdout.isatty(), verbose=verbose), nl=False)

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


@app.command("report")
def report_log(
    log: Annotated[Path, typer.Argument(help="A training-monitor JSONL log (objdebug.monitor).")],
    debug: DebugOpt = False,
) -> None:
    """Render a training-monitor log with its verdicts; exit 1 if a failure was recorded."""
    def body():
        from objdebug import monitor

        rep = monitor.report(str(log))
        typer.echo(monitor.render_report(rep, colour=sys.stdout.isatty()), nl=False)
        raise typer.Exit(rep["exit_code"])

    guarded(debug, body)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
