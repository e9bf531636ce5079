"""What a person or a CI log sees while a run works: stages, graph compiles, batches.

The library reports events to a `Progress` object and never draws anything itself:

- `api.run` calls `run_start` / `stage_start` / `stage_end` / `run_end` around its stage loop;
- `Engine.call` calls `compile_start` / `compile_end` around every first call of a (graph, shapes)
  pair — in graph mode that first call is the compile, often most of a run's time;
- `Engine.evaluate` wraps its batches in `task(label, total)` and ticks once per batch.

`Progress` itself does nothing: it is the API's default, so a Python caller sees no output unless
it passes a display (its own subclass, or one of the two below). `for_stream` picks the CLI's:
`LiveProgress` (rich) on a terminal, `LineProgress` (plain lines and a heartbeat) in a CI log.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

HEARTBEAT_S = 30.0  # a CI log without a line for this long looks hung


@dataclass
class StageSummary:
    """What `stage_end` reports: verdict counts, wall time and the stage's graph compiles."""

    stage: str
    counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    compiles: int = 0
    compile_seconds: float = 0.0

    @classmethod
    def of(cls, stage: str, results: list, seconds: float, compiles: list) -> "StageSummary":
        """From a stage's CheckResults and CompileRecords."""
        counts: dict[str, int] = {}
        for r in results:
            for f in r.findings:
                counts[f.verdict.value] = counts.get(f.verdict.value, 0) + 1
        order = ("PASS", "INFO", "WARN", "FAIL", "ERROR", "SKIP")
        counts = {v: counts[v] for v in order if v in counts}
        return cls(stage, counts, float(seconds), len(compiles), float(sum(c.seconds for c in compiles)))

    def text(self) -> str:
        shown = [f"{n} {v.lower()}" for v, n in self.counts.items() if n]
        return (f"{', '.join(shown) or 'no findings'} · {self.seconds:.1f} s · "
                f"{self.compiles} compile{'s' if self.compiles != 1 else ''}"
                + (f" ({self.compile_seconds:.1f} s)" if self.compiles else ""))


def shapes_text(signature: str) -> str:
    """'Int32[8, 256],Int32[8, 256]' -> '[8, 256]': the distinct input shapes, dtypes dropped."""
    shapes: list[str] = []
    depth, current = 0, ""
    for ch in signature:
        if ch == "[":
            depth += 1
        if depth:
            current += ch
        if ch == "]":
            depth -= 1
            if depth == 0:
                if current not in shapes:
                    shapes.append(current)
                current = ""
    return " ".join(shapes)


class Progress:
    """The no-op display: every hook does nothing. Subclass it and override the hooks you need."""

    def __init__(self, enabled: bool | None = None) -> None:
        """`enabled` is accepted for code written against the old bar (`Progress(enabled=False)`):
        this class never draws; use `for_stream` for a display."""

    def run_start(self, stages: list[str]) -> None:
        """Before the target loads; `stages` in run order."""

    def stage_start(self, stage: str) -> None:
        """A stage begins (also 'load' while the target loads)."""

    def stage_end(self, summary: StageSummary) -> None:
        """A stage ended."""

    def compile_start(self, graph: str, shapes: str) -> None:
        """The first call of graph `graph` with input `shapes` (e.g. '[8, 256]') begins: a compile."""

    def compile_end(self, graph: str, shapes: str, seconds: float) -> None:
        """That first call returned (or raised) after `seconds`."""

    @contextlib.contextmanager
    def task(self, label: str, total: int) -> Iterator[Callable[[], None]]:
        """`with progress.task("align: scoring answers", total=9) as tick: ... tick()` per batch."""
        yield lambda: None

    def run_end(self) -> None:
        """The run is over (also after an exception): stop drawing, leave the terminal sane."""

    @contextlib.contextmanager
    def running(self, stages: list[str]) -> Iterator["Progress"]:
        """run_start ... run_end, the end also on an exception (KeyboardInterrupt included), which
        goes on to the caller: a display never swallows Ctrl-C."""
        self.run_start(stages)
        try:
            yield self
        finally:
            self.run_end()


# --------------------------------------------------------------------------- shared state
class _State:
    """What is happening now: the displays read it (the live one on refresh, the heartbeat on its timer)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.stages: list[str] = []
        self.stage = ""
        self.stage_t0 = time.monotonic()
        self.compile: tuple[str, str, float] | None = None  # graph, shapes, start
        self.task: list[Any] | None = None  # [label, total, done, start]

    def stage_number(self) -> str:
        if self.stage in self.stages:
            return f" ({self.stages.index(self.stage) + 1}/{len(self.stages)})"
        return ""


def _eta(done: int, total: int, elapsed: float) -> str:
    if done <= 0 or total <= done:
        return ""
    return f"ETA {elapsed / done * (total - done):.0f} s"


class _Tracking(Progress):
    """Keeps `_State` up to date; the displays below only decide how to show it."""

    def __init__(self) -> None:
        self.state = _State()

    def run_start(self, stages: list[str]) -> None:
        with self.state.lock:
            self.state.stages = list(stages)

    def stage_start(self, stage: str) -> None:
        with self.state.lock:
            self.state.stage, self.state.stage_t0 = stage, time.monotonic()

    def compile_start(self, graph: str, shapes: str) -> None:
        with self.state.lock:
            self.state.compile = (graph, shapes, time.monotonic())

    def compile_end(self, graph: str, shapes: str, seconds: float) -> None:
        with self.state.lock:
            self.state.compile = None

    @contextlib.contextmanager
    def task(self, label: str, total: int) -> Iterator[Callable[[], None]]:
        entry = [label, int(total), 0, time.monotonic()]

        def tick() -> None:
            with self.state.lock:
                entry[2] += 1

        with self.state.lock:
            self.state.task = entry
        try:
            yield tick
        finally:
            with self.state.lock:
                if self.state.task is entry:
                    self.state.task = None


# --------------------------------------------------------------------------- CI logs
class LineProgress(_Tracking):
    """Plain lines for logs: one when a stage starts and ends, a heartbeat while work goes on.

    No escape codes. The heartbeat is a daemon thread that writes a line every `heartbeat_s`
    seconds while a compile or a batch loop is running, so a CI job never sits silent for long.
    """

    def __init__(self, stream: TextIO | None = None, heartbeat_s: float = HEARTBEAT_S) -> None:
        super().__init__()
        self.stream = stream or sys.stderr
        self.heartbeat_s = float(heartbeat_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last = time.monotonic()

    def _line(self, text: str) -> None:
        with self.state.lock:
            self._last = time.monotonic()
        try:
            self.stream.write(f"objdebug: {text}\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed pipe must not end the run
            pass

    def run_start(self, stages: list[str]) -> None:
        super().run_start(stages)
        self._line(f"stages {', '.join(stages)}")
        if self.heartbeat_s > 0 and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._beat, name="objdebug-heartbeat", daemon=True)
            self._thread.start()

    def stage_start(self, stage: str) -> None:
        super().stage_start(stage)
        self._line(f"{stage}{self.state.stage_number()}: started" if stage != "load"
                   else "load: loading the target")

    def stage_end(self, summary: StageSummary) -> None:
        self._line(f"{summary.stage}: done: {summary.text()}")

    def _beat(self) -> None:
        while not self._stop.wait(min(self.heartbeat_s, 1.0)):
            now = time.monotonic()
            with self.state.lock:
                if now - self._last < self.heartbeat_s:
                    continue
                text = self._doing(now)
            if text:
                self._line(text)

    def _doing(self, now: float) -> str:
        """The heartbeat's line (called with the lock held)."""
        s = self.state
        bits = [f"{s.stage}: still working, {now - s.stage_t0:.0f} s in the stage"]
        if s.compile:
            graph, shapes, t0 = s.compile
            bits.append(f"compiling {graph} {shapes} for {now - t0:.0f} s")
        if s.task:
            label, total, done, t0 = s.task
            bits.append(f"{label}: batch {done}/{total}"
                        + (f", {_eta(done, total, now - t0)}" if _eta(done, total, now - t0) else ""))
        return "; ".join(bits)

    def run_end(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None


# --------------------------------------------------------------------------- terminals
class LiveProgress(_Tracking):
    """A rich live display on a terminal: stage, graph being compiled, batches with ETA; one
    persistent line per finished stage. Drawn on `stream` (stderr), so stdout stays the report.
    """

    def __init__(self, stream: TextIO | None = None, refresh_per_second: float = 8.0,
                 force_terminal: bool | None = None) -> None:
        super().__init__()
        from rich.console import Console

        self.console = Console(file=stream or sys.stderr, highlight=False, force_terminal=force_terminal)
        self.refresh_per_second = refresh_per_second
        self._live = None
        self._t0 = time.monotonic()
        from rich.spinner import Spinner

        self._spinner = Spinner("dots", style="cyan")  # one instance: it animates by its start time

    def run_start(self, stages: list[str]) -> None:
        from rich.live import Live

        super().run_start(stages)
        self._t0 = time.monotonic()
        if self._live is None:
            self._live = Live(console=self.console, get_renderable=self._render, transient=True,
                              refresh_per_second=self.refresh_per_second, redirect_stdout=True,
                              redirect_stderr=True)  # stray prints go above the display
            self._live.start()

    def stage_end(self, summary: StageSummary) -> None:
        from rich.text import Text

        mark = ("✗", "red") if summary.counts.get("FAIL") or summary.counts.get("ERROR") else \
            ("!", "yellow") if summary.counts.get("WARN") else ("✓", "green")
        line = Text.assemble((f"{mark[0]} ", mark[1]), (f"{summary.stage:<10}", "bold"), summary.text())
        self.console.print(line)  # above the live region: it stays when the region goes

    def _render(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        now = time.monotonic()
        s = self.state
        with s.lock:
            stage, number, stage_t0 = s.stage, s.stage_number(), s.stage_t0
            comp = s.compile
            task = list(s.task) if s.task else None
        grid = Table.grid(padding=(0, 1))
        grid.add_column(width=1)
        grid.add_column()
        title = "loading the target" if stage == "load" else f"stage {stage}{number}"
        grid.add_row(self._spinner,
                     Text.assemble((title, "bold"), f" · {now - stage_t0:.1f} s"
                                   f" · total {now - self._t0:.0f} s"))
        if comp:
            graph, shapes, t0 = comp
            grid.add_row("", Text(f"compiling {graph} {shapes}… {now - t0:.1f} s", style="magenta"))
        if task:
            label, total, done, t0 = task
            width = 24
            filled = int(width * done / total) if total else 0
            eta = _eta(done, total, now - t0)
            grid.add_row("", Text.assemble(label + " ", ("━" * filled, "green"),
                                           ("━" * (width - filled), "grey37"),
                                           f" {done}/{total} batches" + (f" · {eta}" if eta else "")))
        return Group(grid)

    def run_end(self) -> None:
        live, self._live = self._live, None
        if live is not None:
            live.stop()  # restores the cursor; transient: the live region is erased


def for_stream(stream: TextIO | None = None, quiet: bool = False,
               heartbeat_s: float | None = None) -> Progress:
    """The CLI's display for `stream` (stderr): live on a terminal, lines otherwise, none if quiet.

    OBJDEBUG_HEARTBEAT_S overrides the heartbeat interval of the line display (30 s).
    """
    stream = stream or sys.stderr
    if quiet:
        return Progress()
    isatty = getattr(stream, "isatty", lambda: False)()
    if isatty and os.environ.get("TERM") != "dumb":
        return LiveProgress(stream)
    if heartbeat_s is None:
        try:
            heartbeat_s = float(os.environ.get("OBJDEBUG_HEARTBEAT_S", HEARTBEAT_S))
        except ValueError:
            heartbeat_s = HEARTBEAT_S
    return LineProgress(stream, heartbeat_s=heartbeat_s)
