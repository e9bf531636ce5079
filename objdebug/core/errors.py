"""Exceptions and the exit codes they map to.

The CLI maps: InputError -> 2 (usage, config or input problem the user can fix),
any other exception -> 3 (internal error). Check failures are verdicts, not exceptions.
"""

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_INPUT_ERROR = 2
EXIT_INTERNAL_ERROR = 3


class ObjdebugError(Exception):
    """Base class for errors objdebug raises on purpose."""


class InputError(ObjdebugError):
    """A config, file, checkpoint or data problem: exit code 2 with one readable message."""

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None):
        self.source = source
        self.line = line
        where = ""
        if source is not None:
            where = f"{source}:{line}: " if line is not None else f"{source}: "
        super().__init__(where + message)
