"""The errors of a paired run: `ExperimentError` (the run could not finish: exit 1) and the
bad input found before anything ran (`ExperimentInputError`, `ServiceFileError`: exit 2)."""

from __future__ import annotations

from residency.errors import BadInput, RunFailed


class ExperimentError(RunFailed):
    """A paired run could not finish; the run directory is left marked `incomplete`."""


class ExperimentInputError(ExperimentError, BadInput):
    """Bad input found before anything ran: an output directory that cannot be used, or a
    service file that cannot be read (`ServiceFileError`); the CLI exits 2."""


class ServiceFileError(ExperimentInputError):
    """A service TOML file is unreadable or invalid (bad input: `residency pair` exits 2)."""
