"""celery_dlx's PySpark export of the failure history (the job behind ``celery -A proj dlx export``).

A package of its own, beside ``celery_dlx``: the driver and the executors import only this package,
pyspark and redis-py, never Celery or ``celery_dlx``, so a Spark cluster needs nothing else installed.
Its launcher, :mod:`celery_dlx_spark.launch`, runs in the app's process instead: it finds the job
with importlib and ships it to the executors as one zip (:func:`build_zip`, without the launcher)
with an entry script (:func:`write_entry`). See ``spark/README.md``.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

#: This package's directory (its modules are shipped from here).
PACKAGE_DIR = Path(__file__).resolve().parent
#: Name of the zip :func:`build_zip` writes (``--py-files``).
ZIP_NAME = "celery_dlx_spark.zip"
#: Name of the entry script :func:`write_entry` writes (spark-submit's primary resource).
ENTRY_NAME = "dlx_export.py"
#: The entry script: everything else is imported from the zip (or the installed package).
ENTRY_SOURCE = (
    '"""spark-submit entry of celery_dlx\'s export: runs celery_dlx_spark.export.main."""\n'
    "import sys\n\n"
    "from celery_dlx_spark.export import main\n\n"
    "sys.exit(main())\n"
)


#: The launcher's module: it runs in the app's process, never on the cluster.
LAUNCHER = "launch.py"


def modules() -> list[Path]:
    """The job's Python files, sorted (what the zip holds): the package without its launcher."""
    return sorted(path for path in PACKAGE_DIR.glob("*.py") if path.name != LAUNCHER)


def build_zip(directory: str | os.PathLike[str]) -> Path:
    """Write ``celery_dlx_spark.zip`` (the package, for ``--py-files``/``addPyFile``) into
    ``directory`` and return its path. Entries have a fixed timestamp, so equal sources give
    equal zips."""
    path = Path(directory) / ZIP_NAME
    tmp = path.with_suffix(".zip.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as archive:
        for module in modules():
            info = zipfile.ZipInfo(f"{__name__}/{module.name}", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, module.read_bytes())
    os.replace(tmp, path)
    return path


def write_entry(directory: str | os.PathLike[str]) -> Path:
    """Write the entry script spark-submit runs into ``directory`` and return its path."""
    path = Path(directory) / ENTRY_NAME
    path.write_text(ENTRY_SOURCE, encoding="utf-8")
    return path
