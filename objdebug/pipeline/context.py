"""What a check sees: the loaded target, the shared engine, the profile, typed run options, and the
measurements the stages share.

Shared measurements (the align rows, the gradient batch, the probes, ...) are typed providers: the
function that computes one is also its key, so `ctx.provide(grad_batch, build)` computes the batch
once per run and every caller gets a `Batch` back, and there are no string keys to mistype or to
collide. Stage settings do not live here: a check receives its profile section in `measure(ctx, th)`
as in `conditions(th)`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # types only: a Context is built by api.run, never imports the profile or engine
    from objdebug.core.config import Config
    from objdebug.engine.core import Engine
    from objdebug.engine.target import Target
    from objdebug.pipeline.profile import Profile

T = TypeVar("T")


@dataclass
class RunOptions:
    """Stage options from the CLI / API; None leaves the choice to the profile or the engine."""

    synthesize: bool = False          # --synthesize: counterparts for align rows with only 'good'
    batch_size: int | None = None     # --batch-size: rows of the gradient batch (default: the engine's)
    samples: int | None = None        # --samples: data rows for the gradient batch and decompose
    expect_trained: bool = False      # --expect-trained: never excuse quality findings as untrained

    @classmethod
    def of(cls, options: "RunOptions | Mapping[str, Any] | None") -> "RunOptions":
        """From the API's dict (None values mean 'not given'); an unknown key is a TypeError."""
        if isinstance(options, RunOptions):
            return options
        given = {k: v for k, v in dict(options or {}).items() if v is not None}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise TypeError(f"For 'options', the keys must be in {sorted(known)}, but got {unknown}.")
        return cls(**given)


@dataclass
class Context:
    config: Config
    target: Target
    engine: Engine
    profile: Profile
    options: RunOptions = field(default_factory=RunOptions)  # dicts are accepted and converted
    out_dir: str | None = None                              # where figures go, when asked
    debug: bool = False
    report_extra: dict[str, Any] = field(default_factory=dict)  # into the report's `extra` (figure paths)
    _provided: dict[Callable[..., Any], Any] = field(default_factory=dict, repr=False)
    # work started beside the checks (`Check.prepare`): anything with `cancel()`, ended by `close()`
    background: list[Any] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.options = RunOptions.of(self.options)

    def close(self) -> None:
        """End the background work no check collected (a run stopped early, a check switched
        off by the profile): its processes go with the run."""
        while self.background:
            self.background.pop().cancel()

    def provide(self, provider: Callable[..., T], build: Callable[[], T], *,
                while_building: T | None = None) -> T:
        """The shared value `provider` computes, built once per run by `build`. A call that comes
        back to `provider` while `build` runs (its inputs ask for it again) gets `while_building`."""
        if provider not in self._provided:
            self._provided[provider] = while_building
            try:
                self._provided[provider] = build()
            except BaseException:
                del self._provided[provider]
                raise
        return self._provided[provider]

    def provided(self, provider: Callable[..., T]) -> T | None:
        """The value when some check already computed it, else None (nothing is computed)."""
        return self._provided.get(provider)

    def forget(self, provider: Callable[..., Any]) -> None:
        """Drop a computed value (a test that changes the config after a measurement)."""
        self._provided.pop(provider, None)
