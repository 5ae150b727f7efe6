"""The output directory: small files (checkpoint, chart, last run) and batch cleanup, on a local
path or on any Hadoop file system (hdfs://, s3a://, abfs://...) through Spark's JVM.

The checkpoint is what makes exports incremental: the last exported stream id, written only
after the Parquet of its batch has committed, atomically (a temp file renamed over the old one).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from celery_dlx_spark.compat import hadoop_configuration, jvm_of

#: Name of the checkpoint file in the output directory.
CHECKPOINT = "_checkpoint.json"
#: Where a Hadoop checkpoint is staged before it replaces the old one (read if the rename died).
CHECKPOINT_NEW = "_checkpoint.json.new"


@dataclass
class Checkpoint:
    """What has been exported to one output directory.

    Attributes:
        stream: the history stream key the export reads (an output directory serves one stream).
        last_id: the last exported stream id; the next export starts after it.
        exported: good records exported so far.
        malformed: malformed records reported so far.
        batches: batches committed so far.
        aggregated_id: the last id the aggregates cover ("" when they are stale).
        updated_ms: when the checkpoint was written.
    """

    stream: str
    last_id: str | None = None
    exported: int = 0
    malformed: int = 0
    batches: int = 0
    aggregated_id: str = ""
    updated_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Checkpoint:
        data = json.loads(text)
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)


def is_local(path: str) -> bool:
    """True for a plain path or a ``file:`` URI."""
    scheme = urlparse(path).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


class LocalStorage:
    """An output directory on the driver's file system (also the executors', in local mode)."""

    def __init__(self, root: str) -> None:
        self.root = Path(root[len("file://") :] if root.startswith("file://") else root)
        self.root.mkdir(parents=True, exist_ok=True)

    def uri(self, name: str) -> str:
        return str(self.root / name)

    def exists(self, name: str) -> bool:
        return (self.root / name).exists()

    def read_text(self, name: str) -> str | None:
        try:
            return (self.root / name).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def write_atomic(self, name: str, data: bytes) -> None:
        """Write ``name`` so a reader sees the old or the new content, never a torn file."""
        target = self.root / name
        temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
        directory = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def delete_glob(self, pattern: str) -> int:
        """Delete what ``pattern`` (relative to the root) matches; returns how many."""
        matches = glob.glob(str(self.root / pattern))
        for match in matches:
            if os.path.isdir(match):
                shutil.rmtree(match)
            else:
                os.remove(match)
        return len(matches)


class HadoopStorage:
    """An output directory on a Hadoop file system, used through the Spark driver's JVM."""

    def __init__(self, spark: Any, root: str) -> None:
        self.root = root.rstrip("/")
        jvm = jvm_of(spark)
        self._jvm = jvm
        self._path_class = jvm.org.apache.hadoop.fs.Path
        conf = hadoop_configuration(spark)
        self._fs = self._path_class(self.root).getFileSystem(conf)
        self._fs.mkdirs(self._path_class(self.root))

    def uri(self, name: str) -> str:
        return f"{self.root}/{name}"

    def _path(self, name: str) -> Any:
        return self._path_class(self.uri(name))

    def exists(self, name: str) -> bool:
        return bool(self._fs.exists(self._path(name)))

    def read_text(self, name: str) -> str | None:
        path = self._path(name)
        if not self._fs.exists(path):
            return None
        stream = self._fs.open(path)
        try:
            # py4j copies a Python buffer into Java, so the bytes must come back as a return value
            data: bytes = self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
        finally:
            stream.close()
        return data.decode("utf-8")

    def write_atomic(self, name: str, data: bytes) -> None:
        """Write ``name.new`` fully, then replace ``name`` with it. Hadoop renames do not
        overwrite, so a crash between the delete and the rename leaves only ``name.new``, which
        :func:`read_checkpoint` reads."""
        staged = self._path(name + ".new")
        out = self._fs.create(staged, True)
        try:
            out.write(bytearray(data))
        finally:
            out.close()
        target = self._path(name)
        if self._fs.exists(target):
            self._fs.delete(target, False)
        if not self._fs.rename(staged, target):
            raise OSError(f"could not rename {staged} to {target}")

    def delete_glob(self, pattern: str) -> int:
        statuses = self._fs.globStatus(self._path(pattern))
        if statuses is None:
            return 0
        for status in statuses:
            self._fs.delete(status.getPath(), True)
        return len(statuses)


Storage = LocalStorage | HadoopStorage


def open_storage(spark: Any, root: str) -> Storage:
    """Local storage for a plain path or ``file:`` URI, Hadoop storage for any other scheme."""
    return LocalStorage(root) if is_local(root) else HadoopStorage(spark, root)


class CheckpointError(ValueError):
    """The checkpoint file exists but cannot be read."""


def read_checkpoint(storage: Storage) -> Checkpoint | None:
    """The output directory's checkpoint, or None before the first export.

    Raises:
        CheckpointError: the file is not a checkpoint (never guessed: a wrong guess would export
            records twice or skip them).
    """
    name = CHECKPOINT
    text = storage.read_text(name)
    if text is None:
        name = CHECKPOINT_NEW
        text = storage.read_text(name)
    if text is None:
        return None
    try:
        return Checkpoint.from_json(text)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(
            f"{storage.uri(name)} is not a readable checkpoint ({exc}); restore it from the "
            f"Redis mirror (HGETALL <stream>:export) or export to a new --out"
        ) from exc


def write_checkpoint(storage: Storage, checkpoint: Checkpoint) -> None:
    """Replace the checkpoint atomically."""
    checkpoint.updated_ms = int(time.time() * 1000)
    storage.write_atomic(CHECKPOINT, checkpoint.to_json().encode("utf-8"))
