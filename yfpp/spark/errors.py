"""Why Spark failed, in one line: the cause at the root of a JVM exception chain, or in what the JVM
wrote to stderr as it died, named with the setting or package that fixes it.

A Py4J error's own message ("An error occurred while calling o71.load.") says
nothing; its text carries the Java exception and its ``Caused by:`` chain,
whose innermost message is the cause. When the JVM has gone (out of memory,
or spark-submit refusing the ``--master`` before the gateway starts) the
Python side sees only a refused connection or ``JAVA_GATEWAY_EXITED``: the
cause is then in the JVM's stderr and its exit status (Spark's 52: out of
memory).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: Spark's exit status for a JVM that ran out of memory (``SparkExitCode.OOM``).
OOM_EXIT = 52
#: The data sources every Spark has.
BUILT_IN_SOURCES = "parquet, orc, json, csv, text, binaryFile, jdbc"
#: Packages of data sources and catalogs people reach for (``--conf spark.jars.packages=…``); SPARK: this PySpark's version.
PACKAGES = {
    "delta": "io.delta:delta-spark_2.13:VERSION (the Delta release for Spark SPARK; and --conf "
             "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension)",
    "kafka": "org.apache.spark:spark-sql-kafka-0-10_2.13:SPARK",
    "avro": "org.apache.spark:spark-avro_2.13:SPARK",
    "iceberg": "org.apache.iceberg:iceberg-spark-runtime-X.Y_2.13:VERSION (X.Y: Spark's, SPARK)",
}

#: An exception line: ``: cls: msg`` (Py4J), ``Caused by: cls: msg``, ``Exception in thread "t" cls: msg``,
#: or one at the start of a line (JVM stderr); the class name is qualified and ends as exception classes do.
_EXCEPTION = re.compile(r'^(?:: |Caused by: |Exception in thread "[^"]*" )?'
                        r'((?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error|Throwable|Failure))(?:: ?(.*))?$')
_NOT_MESSAGE = re.compile(r"^\s*(?:at |\.\.\. \d+ more|Caused by: |Driver stacktrace:|$)")
_GONE = ("Connection refused", "JAVA_GATEWAY_EXITED", "Java gateway process exited", "Error while sending or receiving",
         "Answer from Java side is empty", "Py4JNetworkError", "SparkContext was shut down")


@dataclass(frozen=True)
class Jvm:
    """What is known of the driver JVM this command started: the end of its stderr and its exit status
    (None: running, or unknown)."""

    said: str = ""
    exit_code: int | None = None


def error_text(e: BaseException) -> str:
    """``str(e)``; when that fails — a Py4J error's ``str`` asks the JVM for the trace, and a JVM that has
    gone cannot answer — the error's message and what asking raised (a ``Py4JNetworkError``, which
    :func:`jvm_gone` reads as the JVM gone)."""
    try:
        return str(e)
    except Exception as asking:
        return f"{getattr(e, 'errmsg', '') or type(e).__name__}\n{type(asking).__name__}: {asking}"


def jvm_gone(text: str) -> bool:
    """Does an error's text say the JVM has gone (a refused connection, the gateway exited)?"""
    return any(g in text for g in _GONE)


def chain(text: str) -> list[tuple[str, str]]:
    """The Java exceptions in ``text``, outermost first: ``(class, message)``, a message continued on the
    lines below its exception's (up to a stack frame or a blank line) joined with spaces, Spark's
    ``SQLSTATE`` left out."""
    out: list[tuple[str, str]] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _EXCEPTION.match(line.strip() if line.startswith(("Caused by", "Exception in")) else line)
        if not m:
            continue
        parts = [m.group(2) or ""]
        for more in lines[i + 1:]:
            if _NOT_MESSAGE.match(more) or _EXCEPTION.match(more):
                break
            parts.append(more.strip())
        message = re.sub(r"\s*SQLSTATE: \w+\s*$", "", " ".join(p for p in parts if p)).strip()
        if (m.group(1), message) not in out:
            out.append((m.group(1), message))
    return out


def root_message(causes: list[tuple[str, str]]) -> str | None:
    """The root cause's message — the outermost one that contains it (``Connection refused: /host:1``
    rather than ``Connection refused``); the root's class name when it has no message."""
    if not causes:
        return None
    cls, root = causes[-1]
    if not root:
        return cls.rsplit(".", 1)[-1]
    return next(msg for _, msg in causes if root in msg)


def out_of_memory(text: str, master: str | None) -> str:
    """The line for a JVM out of memory: which JVM, and the setting that gives it more."""
    detail = re.search(r"OutOfMemoryError: ([^\n]+)", text)
    what = detail.group(1).strip() if detail else ""
    task = re.search(r"Lost task [^\n]*?\(([^()]*) executor (\S+?)\)", text)
    local = (master or "local").startswith("local") and not (master or "").startswith("local-cluster")
    if not local and task and task.group(2) != "driver":
        return (f"an executor ran out of memory{f' ({what})' if what else ''}: give the executors more with --conf spark.executor.memory=… "
                "(spark-submit --executor-memory; default 1g), or more --partitions for smaller tasks")
    notes = "; ".join(n for n in (what, "in local mode it runs the tasks too" if local else "") if n)
    return (f"the driver JVM ran out of memory{f' ({notes})' if notes else ''}: give it more with --conf spark.driver.memory=… "
            "(spark-submit --driver-memory; default 1g)")


def missing_package(text: str) -> str | None:
    """The line for a data source or class that is not on the class path, with the package to add."""
    source = re.search(r"Failed to find (?:the )?data source: ([\w.\-]+?)\.? ", text + " ")  # ("… data source: kafka." for Kafka)
    cls = re.search(r"ClassNotFoundException: ([\w.$]+)", text)
    if source:
        name = source.group(1)
        what = f"data source {name!r} not found"
    elif cls:
        name = cls.group(1)
        what = f"class {name} not found"
    else:
        return None
    known = next((p for k, p in PACKAGES.items() if k in name.lower()), "GROUP:ARTIFACT:VERSION")
    built_in = f" (built in: {BUILT_IN_SOURCES})" if source else ""
    return f"{what}{built_in}: its package is not on the class path; add it: --conf spark.jars.packages={known}".replace(
        "SPARK", _spark_version())


def _spark_version() -> str:
    try:
        import pyspark

        return pyspark.__version__
    except ImportError:
        return "SPARK_VERSION"


def spark_cause(e: BaseException, master: str | None = None, jvm: Jvm | None = None) -> str | None:
    """The cause of a Spark failure in one line (:func:`known_cause`, else :func:`root_cause`), or None
    when neither the exception nor the JVM names one."""
    text = error_text(e)
    return known_cause(text, master, jvm) or root_cause(text, jvm)


def known_cause(text: str, master: str | None = None, jvm: Jvm | None = None) -> str | None:
    """The causes that have a fix to name: no Java to start, the JVM out of memory (anywhere in the chain, in
    its stderr, or its exit status 52), a data source or class not on the class path, a file system scheme
    Hadoop does not know."""
    said = jvm.said if jvm else ""
    java = re.search(r"(\S*/bin/java): No such file or directory|JAVA_HOME is not set|java: command not found", said)
    if java:  # (spark-class could not run a JVM at all)
        where = f"{java.group(1)} does not exist" if java.group(1) else java.group(0)
        return f"no Java: {where}; set JAVA_HOME to a Java 17 (or put its java on PATH)"
    if "OutOfMemoryError" in text or "OutOfMemoryError" in said or (jvm and jvm.exit_code == OOM_EXIT):
        return out_of_memory(text if "OutOfMemoryError" in text else said, master)
    package = missing_package(text)
    if package:
        return package
    scheme = re.search(r'No FileSystem for scheme "([^"]*)"', text)
    if scheme:
        return (f'no file system for scheme "{scheme.group(1)}": inputs and outputs are paths of a Hadoop file system '
                "— file:// and hdfs:// here; s3a://, gs://, abfs:// with their connector (--conf spark.jars.packages=…)")
    return None


def root_cause(text: str, jvm: Jvm | None = None) -> str | None:
    """The root of the exception chain in ``text`` — or, when the JVM has gone (a refused connection, an
    exit status), in what it wrote to stderr; failing that, its exit status and last line."""
    gone = jvm_gone(text) or (jvm is not None and jvm.exit_code is not None)
    said = jvm.said if jvm else ""
    found = root_message((gone and chain(said)) or chain(text))
    if found:
        return found
    if gone and jvm is not None and jvm.exit_code is not None:
        last = next((ln.strip() for ln in reversed(said.splitlines()) if ln.strip()), "")
        return f"the driver JVM exited with status {jvm.exit_code}" + (f": {last}" if last else "")
    return None
