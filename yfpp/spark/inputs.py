"""Where the input is: the files of a path, as Spark's file system layer lists them on the driver.

Any URI Spark can read (``file://``, ``hdfs://``, ``s3a://`` with its jars and
credentials configured, …), a glob, or a plain path — a relative one is made
absolute here, on the driver, since the executors run in other working
directories. Directories are read recursively (Hive-style ``key=value/``
folders too, as plain subdirectories); names starting with ``.`` or ``_``
(``_SUCCESS``, ``.crc`` files) are skipped, as Spark skips them.
"""

from __future__ import annotations

import os
import re
from typing import Any

from yfpp.errors import InputError

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
#: Names Spark may split at line boundaries (anything else — XML, .gz — is read whole, one task per file).
SPLITTABLE = (".jsonl", ".json", ".ndjson")


def qualify(spark: Any, path: str) -> str:
    """``path`` as the executors must see it: a URI unchanged, a relative local path made absolute."""
    if _SCHEME.match(path) or os.path.isabs(path):
        return path
    default_fs = spark.sparkContext._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///"
    return os.path.abspath(path) if default_fs.startswith("file:") else path


def list_files(spark: Any, path: str | os.PathLike[str]) -> list[str]:
    """The files of ``path`` (a file, directory or glob, recursively), as URIs in path order.

    Raises :class:`InputError` when the path does not exist, cannot be listed,
    or holds no files.
    """
    given = os.fspath(path)
    try:
        files = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(qualify(spark, given)).inputFiles()
    except Exception as e:  # AnalysisException, or a Py4J error from the file system
        raise InputError(listing_error(given, e)) from None
    if not files:
        raise InputError(f"no input files in {given} (empty, or only hidden and _ names)")
    return sorted(files)


def listing_error(path: str, e: BaseException) -> str:
    """One line for an exception Spark raised while listing ``path``."""
    text = str(e)
    if "PATH_NOT_FOUND" in text or "does not exist" in text:
        return f"no such input: {path}"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)
    return f"cannot list {path}: {first}"


def splittable(uri: str, format: str | None) -> bool:
    """May Spark split this file at line boundaries (plain JSON lines, not compressed)?"""
    return format in (None, "jsonl") and uri.lower().endswith(SPLITTABLE)


def single_file(given: str, files: list[str]) -> bool:
    """Did ``given`` name one file (its dead letters' positions then carry no file name, as in ``yfpp run``)?"""
    name = os.path.basename(given.rstrip("/"))
    return len(files) == 1 and not any(c in given for c in "*?[{") and files[0].rsplit("/", 1)[-1] == name
