"""The one error hierarchy of the suite (as papermill's `exceptions.py`).

* `ResidencyError`: the root; every error the suite raises on purpose is one.
* `BadInput` (also a `ValueError`): a file, field, option or parameter that cannot be used; the
  CLI prints it on one line and exits 2.
* `RunFailed` (also a `RuntimeError`): something that ran but could not finish, or a failed
  gate or verification; the CLI exits 1.

Each concern's own class derives from one of them (`RunDirError`, `TraceError`, ...), so a
caller may catch the family or the concern.
"""

from __future__ import annotations

__all__ = ["CHANGED_SINCE_VERIFIED", "BadInput", "ResidencyError", "RunFailed"]

# what a file of a verified run is said to be when the bytes read do not match its seal
# (run records in `residency.rundir`, traces in `residency.traces.files`)
CHANGED_SINCE_VERIFIED = ("changed since the run was verified (the bytes read do not match its "
                          "sealed sha256: edited, swapped or served differently after "
                          "`verify`); nothing read from it is used")


class ResidencyError(Exception):
    """The root of every error `residency` raises on purpose."""


class BadInput(ResidencyError, ValueError):
    """Input that cannot be used (a file, field, option or parameter): exit 2."""


class RunFailed(ResidencyError, RuntimeError):
    """Work that ran but failed, or a gate or verification that did not pass: exit 1."""
