"""Click's test runner with standard error kept apart from standard output, on every click."""

from __future__ import annotations

import inspect
from typing import Any

from click.testing import CliRunner


def cli_runner(**kwargs: Any) -> CliRunner:
    """A ``CliRunner`` whose results have their own ``stderr``: click 8.2 always keeps it apart
    (and dropped the option), click 8.1 does with ``mix_stderr=False``."""
    if "mix_stderr" in inspect.signature(CliRunner.__init__).parameters:
        kwargs["mix_stderr"] = False
    return CliRunner(**kwargs)
