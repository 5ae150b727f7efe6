"""What a worker loads: Celery's command line imports the ``dlx`` group, not its commands."""

from __future__ import annotations

import json
import subprocess
import sys


def _loaded_after(code: str, prefixes: tuple[str, ...]) -> list[str]:
    probe = (
        f"{code}\nimport json, sys\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({prefixes!r}))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    names: list[str] = json.loads(out.stdout)
    return names


def test_the_dlx_group_loads_its_commands_on_first_look() -> None:
    prefixes = ("celery_dlx.cli.", "celery_dlx_console", "celery_dlx.ops")
    assert _loaded_after("import celery_dlx.cli.main", prefixes) == ["celery_dlx.cli.main"]
    listed = _loaded_after("from celery_dlx.cli.main import dlx\nsorted(dlx.commands)", prefixes)
    assert {"celery_dlx.cli.graveyard", "celery_dlx.cli.web"} <= set(listed)
    # The console's command is listed; the console itself is imported only when it runs.
    assert [name for name in listed if name.startswith("celery_dlx_console")] == []
