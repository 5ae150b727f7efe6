"""The Hadoop file system path of the output directory (used for hdfs://, s3a://...), exercised
on file:// through the real JVM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

dlx_storage = pytest.importorskip("celery_dlx_spark.storage")

pytestmark = pytest.mark.spark


def test_hadoop_storage_checkpoint_and_batch_cleanup(spark: Any, tmp_path: Path) -> None:
    storage = dlx_storage.HadoopStorage(spark, tmp_path.as_uri())
    assert dlx_storage.read_checkpoint(storage) is None
    dlx_storage.write_checkpoint(storage, dlx_storage.Checkpoint(stream="s", last_id="1-0"))
    dlx_storage.write_checkpoint(
        storage, dlx_storage.Checkpoint(stream="s", last_id="2-0", exported=7)
    )
    checkpoint = dlx_storage.read_checkpoint(storage)
    assert (checkpoint.last_id, checkpoint.exported) == ("2-0", 7)
    assert not (tmp_path / dlx_storage.CHECKPOINT_NEW).exists()

    # killed between deleting the old checkpoint and renaming the new one into place
    (tmp_path / dlx_storage.CHECKPOINT).rename(tmp_path / dlx_storage.CHECKPOINT_NEW)
    assert dlx_storage.read_checkpoint(storage).last_id == "2-0"

    (tmp_path / "malformed" / "batch=after-1-0").mkdir(parents=True)
    (tmp_path / "malformed" / "batch=after-1-0" / "part.parquet").write_bytes(b"x")
    assert storage.delete_glob("malformed/batch=after-1-0") == 1
    assert storage.delete_glob("malformed/batch=after-1-0") == 0
    assert not (tmp_path / "malformed" / "batch=after-1-0").exists()


def test_plain_paths_and_file_uris_are_local(tmp_path: Path) -> None:
    assert dlx_storage.is_local(str(tmp_path)) and dlx_storage.is_local(tmp_path.as_uri())
    assert not dlx_storage.is_local("hdfs://namenode:8020/dlx")
    storage = dlx_storage.open_storage(None, tmp_path.as_uri())
    assert isinstance(storage, dlx_storage.LocalStorage) and storage.root == tmp_path
