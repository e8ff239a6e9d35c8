"""Spark for the export tests: one local SparkSession per test module (its JVM start is
most of the cost) and the docs' Spark SQL run over a dataset."""

from __future__ import annotations

import os
import shutil
import sys
import time

import pytest

from test_fleet import doc_spark_statements


@pytest.fixture(scope="module")
def spark():
    """One local SparkSession for the module: one core, no UI, one shuffle partition,
    and a JVM that compiles with C1 only (a short run: half the time of the default)."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail("no Java runtime: scripts/setup.sh installs Debian's openjdk-17-jre-headless")
    from pyspark.sql import SparkSession  # installed by scripts/setup.sh (pyproject's test extra)

    started = time.monotonic()
    session = (SparkSession.builder.master("local[1]").appName("ctracer-test")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
               .config("spark.sql.shuffle.partitions", "1")
               .config("spark.driver.memory", "1g")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    print(f"SparkSession started in {time.monotonic() - started:.1f} s", file=sys.stderr)
    yield session
    session.stop()


def spark_answers(spark, location: str) -> list[list[dict]]:
    """Every result of the docs' Spark SQL over ``location``, as dicts."""
    answers = []
    for statement in doc_spark_statements(location):
        started = time.monotonic()
        df = spark.sql(statement)
        if statement.upper().startswith("SELECT"):
            answers.append([row.asDict() for row in df.collect()])
        print(f"spark: {time.monotonic() - started:.1f} s: {statement[:50]!r}", file=sys.stderr)
    return answers
