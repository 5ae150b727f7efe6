"""The only place ``celery_dlx_spark`` touches pyspark's private internals (checked on pyspark
4.3.0, installed here, and 4.1.0, the lowest the ``spark`` extra allows, by reading its sources).

``celery_dlx_spark`` imports nothing of ``celery_dlx``, so it keeps its own compat module beside
``celery_dlx/compat/``. Canary: ``tests/unit/test_compat_canaries.py`` (pyspark section).
"""

from __future__ import annotations

from typing import Any


def jvm_of(spark: Any) -> Any:
    """The py4j view of the JVM of ``spark``'s driver (``jvm.org.apache...``).

    Internal: ``SparkContext._jvm``. pyspark reaches Hadoop's ``FileSystem`` only through it;
    the export needs it for its small files (checkpoint, chart) on ``hdfs://``, ``s3a://``...
    """
    return spark.sparkContext._jvm


def hadoop_configuration(spark: Any) -> Any:
    """The Hadoop ``Configuration`` of ``spark``'s context (a py4j object).

    Internal: ``SparkContext._jsc``, the ``JavaSparkContext`` whose ``hadoopConfiguration()`` is
    what Spark's own readers use (credentials, endpoints of the file systems).
    """
    return spark.sparkContext._jsc.hadoopConfiguration()


def join_gateway() -> None:
    """Join the JVM of a ``spark-submit`` run (its gateway), or start one, before anything reads
    a ``SparkConf``: that JVM's system properties hold ``--master``, ``--conf`` and
    ``spark-defaults.conf``.

    Internal: ``SparkContext._ensure_initialized()``, what ``SparkContext`` and ``SparkConf``
    call themselves; nothing public starts the gateway without making a context.
    """
    from pyspark import SparkContext

    SparkContext._ensure_initialized()
