"""A failure of the JVM, the cluster manager, a source or a sink is one ``yfpp: error:`` line naming the
cause Spark gave (``yfpp.spark.errors``): from texts Spark wrote, and provoked for real where that is
possible here (the JVM's heap too small, an unknown master scheme or file system, Delta not installed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from yfpp.cli import main  # noqa: E402
from yfpp.input.generate import generate_rfid, write_events  # noqa: E402
from yfpp.spark.cli import job_error  # noqa: E402
from yfpp.spark.errors import Jvm, chain, error_text, jvm_gone, spark_cause  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
QUERY = "PATTERN SEQ(shelf a, ~register b, exit c) WHERE [tag_id] WITHIN 1 hour"

K8S = ("An error occurred while calling None.org.apache.spark.api.java.JavaSparkContext.\n"
       ": io.fabric8.kubernetes.client.KubernetesClientException: An error has occurred.\n"
       "\tat io.fabric8.kubernetes.client.KubernetesClientException.launderThrowable(KubernetesClientException.java:109)\n"
       "Caused by: java.io.IOException: Connection refused: /127.0.0.1:1\n\tat x.Y(Y.java:1)\n\t... 20 more\n"
       "Caused by: java.net.ConnectException: Connection refused\n\tat z.W(W.java:1)\n")
YARN = ("WARNING: Using incubator modules: jdk.incubator.vector\n"
        "Exception in thread \"main\" org.apache.spark.SparkException: When running with master 'yarn' either "
        "HADOOP_CONF_DIR or YARN_CONF_DIR must be set in the environment.\n"
        "\tat org.apache.spark.deploy.SparkSubmitArguments.error(SparkSubmitArguments.scala:670)\n")
STAGE_OOM = ("An error occurred while calling o134.collectToPython.\n: org.apache.spark.SparkException: Job aborted due "
             "to stage failure: Task 0 in stage 0.0 failed 1 times, most recent failure: Lost task 0.0 in stage 0.0 "
             "(TID 0) (192.0.2.2 executor EXEC): java.lang.OutOfMemoryError: Java heap space\n\nDriver stacktrace:\n"
             "Caused by: java.lang.OutOfMemoryError: Java heap space\n")
SMALL_HEAP = ("An error occurred while calling None.org.apache.spark.api.java.JavaSparkContext.\n"
              ": org.apache.spark.SparkIllegalArgumentException: [INVALID_DRIVER_MEMORY.SYSTEM_MEMORY] Insufficient driver"
              " memory: System memory 64880640 must be at least 471859200.\nPlease increase heap size using the "
              "--driver-memory option or \"spark.driver.memory\" in Spark configuration. SQLSTATE: F0000\n\tat x.Y(Y.scala:1)\n")


def test_the_chain_is_read_from_the_text_and_its_root_named_with_the_most_said_of_it():
    assert [c for c, _ in chain(K8S)] == ["io.fabric8.kubernetes.client.KubernetesClientException",
                                          "java.io.IOException", "java.net.ConnectException"]
    assert spark_cause(Exception(K8S)) == "Connection refused: /127.0.0.1:1"
    assert spark_cause(Exception(SMALL_HEAP)) == (  # a message on two lines, SQLSTATE left out
        "[INVALID_DRIVER_MEMORY.SYSTEM_MEMORY] Insufficient driver memory: System memory 64880640 must be at least "
        "471859200. Please increase heap size using the --driver-memory option or \"spark.driver.memory\" in Spark "
        "configuration.")
    assert spark_cause(Exception("no trace here")) is None


def test_no_java_to_start_names_java_home():
    said = ("/usr/lib/pyspark/bin/spark-class: line 71: /opt/none/bin/java: No such file or directory\n"
            "/usr/lib/pyspark/bin/spark-class: line 97: CMD: bad array subscript\n")
    cause = spark_cause(RuntimeError("[JAVA_GATEWAY_EXITED] Java gateway process exited before sending its port number."),
                        None, Jvm(said, None))
    assert cause == "no Java: /opt/none/bin/java does not exist; set JAVA_HOME to a Java 17 (or put its java on PATH)"


def test_a_jvm_that_exited_is_asked_what_it_said():
    exited = Exception("[JAVA_GATEWAY_EXITED] Java gateway process exited before sending its port number.")
    assert spark_cause(exited, "yarn", Jvm(YARN, 1)) == (
        "When running with master 'yarn' either HADOOP_CONF_DIR or YARN_CONF_DIR must be set in the environment.")
    shut = Exception("Job 0 cancelled because SparkContext was shut down")  # the job's side of a JVM that died
    assert spark_cause(shut, "local[1]", Jvm("", 52)).startswith("the driver JVM ran out of memory")
    refused = ConnectionRefusedError(111, "Connection refused")
    assert "spark.driver.memory" in spark_cause(refused, "local[2]", Jvm("", 52))  # Spark's exit status for OOM
    assert spark_cause(refused, "local[2]", Jvm("some last words\n", 3)) == (
        "the driver JVM exited with status 3: some last words")


class _AskedAJvmThatHasGone(Exception):
    """A Py4J error whose JVM died as it failed: its ``str`` asks the JVM for the trace, and cannot."""

    errmsg = "An error occurred while calling o132.collectToPython.\n"

    def __str__(self) -> str:
        from py4j.protocol import Py4JNetworkError

        raise Py4JNetworkError("Answer from Java side is empty")


def test_an_error_whose_jvm_cannot_be_asked_reads_as_the_jvm_gone_and_its_exit_status_names_the_cause():
    """The job's error says only "An error occurred while calling …" when the JVM died under it: what asking
    raised is kept, so the caller waits for the JVM's exit status (Spark's 52: out of memory) before naming it."""
    text = error_text(_AskedAJvmThatHasGone())
    assert text.startswith("An error occurred while calling o132.collectToPython.") and jvm_gone(text), text
    assert job_error(_AskedAJvmThatHasGone(), "local[1]", Jvm("", 52), text).startswith(
        "the driver JVM ran out of memory")


@pytest.mark.parametrize("executor, master, setting", [
    ("driver", "local[2]", "spark.driver.memory"), ("3", "spark://h:7077", "spark.executor.memory"),
    ("driver", "spark://h:7077", "spark.driver.memory")])
def test_out_of_memory_names_the_jvm_and_the_setting_that_raises_its_heap(executor, master, setting):
    line = spark_cause(Exception(STAGE_OOM.replace("EXEC", executor)), master)
    assert "ran out of memory (Java heap space" in line and f"--conf {setting}=" in line, line


def _yfpp_spark(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yfpp", "spark", "-q", QUERY, *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_an_unknown_master_scheme_names_the_ones_spark_knows(tmp_path):
    write_events(generate_rfid(50, tags=5, gap=3, seed=1), tmp_path / "feed.jsonl")
    proc = _yfpp_spark("-i", str(tmp_path / "feed.jsonl"), "-o", str(tmp_path / "out"), "--master", "foo://x")
    assert (proc.returncode, proc.stderr) == (2, "yfpp: error: cannot start Spark with --master foo://x: Master must "
                                                 "either be yarn or start with spark, k8s, or local\n")


@pytest.mark.skipif(not hasattr(os, "truncate"), reason="a sparse file")
def test_a_heap_too_small_for_the_job_says_which_setting_raises_it(tmp_path):
    """A 1 GiB XML file (sparse: no disk used) is read whole by one task of the shuffle plan, in a 512 MiB
    driver JVM (local mode: it runs the tasks): the JVM runs out of heap at once and exits."""
    with open(tmp_path / "huge.xml", "wb") as f:
        f.truncate(2**30)
    proc = _yfpp_spark("-i", str(tmp_path / "huge.xml"), "-o", str(tmp_path / "out"), "--master", "local[1]",
                       "--plan", "shuffle", "--conf", "spark.driver.memory=512m")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("yfpp: error: the driver JVM ran out of memory") and proc.stderr.count("\n") == 1
    assert "--conf spark.driver.memory=" in proc.stderr and "--driver-memory" in proc.stderr


def test_an_input_scheme_without_a_file_system_says_what_is_read(spark, tmp_path, capsys):
    assert main(["spark", "-q", QUERY, "-i", "kafka://127.0.0.1:9092/topic", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith('yfpp: error: cannot list kafka://127.0.0.1:9092/topic: no file system for scheme "kafka": '
                          "inputs and outputs are paths of a Hadoop file system") and err.count("\n") == 1, err


def test_a_table_in_a_format_whose_package_is_missing_names_the_package(spark, tmp_path, capsys):
    write_events(generate_rfid(200, tags=5, gap=3, seed=2), tmp_path / "feed.jsonl")
    args = ["spark", "-q", QUERY, "-i", str(tmp_path / "feed.jsonl"), "-o", str(tmp_path / "out"),
            "--table", "yfpp_errors_delta", "--conf", "spark.sql.sources.default=delta"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("yfpp: error: data source 'delta' not found (built in: parquet") and err.count("\n") == 1, err
    assert "--conf spark.jars.packages=io.delta:delta-spark_2.13:" in err
    assert spark.conf.get("spark.sql.sources.default") == "parquet"  # the borrowed session's setting given back
