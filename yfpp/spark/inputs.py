"""Where the input is: the files of a path, as Spark's file system layer lists them on the driver.

Any URI Spark can read (``file://``, ``hdfs://``, ``s3a://`` with its jars and
credentials configured, …), a glob, or a plain path — a relative one is made
absolute here, on the driver, since the executors run in other working
directories. Directories are read recursively (Hive-style ``key=value/``
folders too, as plain subdirectories); names starting with ``.`` or ``_``
(``_SUCCESS``, ``.crc`` files) are skipped, as Spark skips them.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any, Sequence
from urllib.parse import unquote, urlparse

from yfpp.errors import InputError, YfppError
from yfpp.spark.errors import error_text, spark_cause

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
#: Names Spark may split at line boundaries (anything else — XML, .gz — is read whole, one task per file).
SPLITTABLE = (".jsonl", ".json", ".ndjson")
#: ``yfpp spark --plan``: how a batch job reads its input (see :func:`choose_plan`).
PLANS = ("auto", "scan", "shuffle")


def qualify(spark: Any, path: str) -> str:
    """``path`` as the executors must see it: a URI unchanged, a relative local path made absolute."""
    if _SCHEME.match(path) or os.path.isabs(path):
        return path
    return os.path.abspath(path) if default_fs(spark).startswith("file:") else path


def default_fs(spark: Any) -> str:
    """The file system of a path without a scheme (Hadoop's ``fs.defaultFS``; ``file:///`` unless configured)."""
    return spark.sparkContext._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///"


def local_path(uri: str) -> str | None:
    """The local file a path or ``file:`` URI names (percent-decoded, as Spark lists them); None for another scheme."""
    if not _SCHEME.match(uri):
        return uri
    u = urlparse(uri)
    return unquote(u.path) if u.scheme == "file" and u.netloc in ("", "localhost") else None


def socket_address(text: str) -> tuple[str, int] | None:
    """``HOST:PORT`` as ``(host, port)`` (no host: localhost; ``[::1]``: ``::1``), None unless the
    port is a number from 1 to 65535."""
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.removeprefix("[").removesuffix("]") or "localhost", int(port)


def hadoop_path(uri: str) -> str:
    """A URI as Spark lists it (percent-encoded: ``file:/a%20b/x``) as the path string that Spark's readers
    turn back into that file (``file:/a b/x``: Hadoop's ``Path`` encodes again), glob characters escaped."""
    return re.sub(r"([\\{}\[\]*?])", r"\\\1", unquote(uri))


def choose_plan(requested: str, paths: str | Sequence[str], fs: str = "file:///") -> str:
    """``scan`` or ``shuffle`` for a batch job over ``paths`` (qualified, :func:`qualify`; ``fs``: the
    default file system). ``auto`` scans when every path is local — a ``file:`` URI, or a path without a
    scheme on a local default file system — since every scan task opens the files itself; ``scan`` of
    another file system is refused (:class:`InputError`)."""
    remote = [p for p in ([paths] if isinstance(paths, str) else paths)
              if not (local_path(p) is not None if _SCHEME.match(p) else fs.startswith("file:"))]
    if requested == "auto":
        return "shuffle" if remote else "scan"
    if requested == "scan" and remote:
        raise InputError(f"--plan scan reads the input in every task as local files, not from {remote[0]}: use --plan shuffle")
    return requested


def list_inputs(spark: Any, paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                here: bool = False) -> list[str]:
    """The files of one or several paths, read as one stream: the paths in the order given, each one's
    files in path order (a glob's matches sorted, a directory's files too), listed by Spark
    (:func:`list_files`; ``here``: local paths listed here instead, :func:`local_files`). Raises
    :class:`InputError` as they do, and for a file that two paths name (it would be read twice)."""
    files: list[str] = []
    seen: dict[str, str] = {}
    for given in [paths] if isinstance(paths, (str, os.PathLike)) else paths:
        given = os.fspath(given)
        for f in (here and local_files(qualify(spark, given))) or list_files(spark, given):
            if same_file(f) in seen:
                raise InputError(f"{f} is named twice, by {seen[same_file(f)]} and {given}: give each file once")
            seen[same_file(f)] = given
            files.append(f)
    return files


def same_file(uri: str) -> str:
    """One name per file for its listed forms: a local path, ``file:/x`` (Spark's reader columns) and
    ``file:///x`` (Spark's listing) as the decoded local path; another URI decoded."""
    return local_path(uri) or unquote(uri)


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
    return sorted(files, key=unquote)  # (percent-encoded: in the order of the names on disk)


def local_files(path: str) -> list[str] | None:
    """The files of a local path or ``file:`` URI (or glob), listed here — no Spark job, no JVM — as
    :func:`list_files` lists them (recursively, hidden names skipped, path order); None for a glob
    with braces (``{a,b}``: Spark's to expand). Raises :class:`InputError` as :func:`list_files`."""
    local = local_path(path)
    if local is None or "{" in local:
        return None
    roots = sorted(glob.glob(local)) if any(c in local for c in "*?[") else [local]
    if not any(os.path.exists(r) for r in roots):
        raise InputError(f"no such input: {path}")
    files = []
    for root in roots:
        if not os.path.isdir(root):
            files.append(root)
            continue
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if not _hidden(d)]
            files += [os.path.join(folder, n) for n in names if not _hidden(n)]
    if not files:
        raise InputError(f"no input files in {path} (empty, or only hidden and _ names)")
    return sorted(files)


def _hidden(name: str) -> bool:
    """A name Spark's file index skips (``InMemoryFileIndex.shouldFilterOutPathName``)."""
    return (name.startswith("_") and "=" not in name) or name.startswith(".") or name.endswith("._COPYING_")


def listing_error(path: str, e: BaseException) -> str:
    """One line for an exception Spark raised while listing ``path``."""
    text = error_text(e)
    if "PATH_NOT_FOUND" in text or "does not exist" in text:
        return f"no such input: {path}"
    first = spark_cause(e) or next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)
    return f"cannot list {path}: {first}"


def splittable(uri: str, format: str | None) -> bool:
    """May Spark split this file at line boundaries (plain JSON lines, not compressed)?"""
    return format in (None, "jsonl") and uri.lower().endswith(SPLITTABLE)


def single_file(given: str | Sequence[str], files: list[str]) -> bool:
    """Did ``given`` (a path, or the paths of :func:`list_inputs`) name one file (its dead letters'
    positions then carry no file name, as in ``yfpp run``)?"""
    if not isinstance(given, str):
        if len(given) != 1:
            return False
        given = given[0]
    name = os.path.basename(given.rstrip("/"))
    return len(files) == 1 and not any(c in given for c in "*?[{") and files[0].rsplit("/", 1)[-1] == name


LIVE_SCHEMES = ("tcp://", "mqtt://", "mqtts://")  #: the URLs of live sources (:mod:`yfpp.spark.live_sources`)


def is_live(path: str) -> bool:
    """Is ``path`` a live source's URL?"""
    return path.startswith(LIVE_SCHEMES)


def check_live_url(url: str) -> None:
    """YfppError unless ``url`` is a live source :mod:`yfpp.spark.live_sources` reads (checked before the JVM starts)."""
    if url.startswith("tcp://"):
        if socket_address(url.removeprefix("tcp://").rstrip("/")) is None:
            raise YfppError(f"a TCP source is tcp://HOST:PORT (a port from 1 to 65535), not {url!r}")
        return
    from yfpp.input.mqtt import Topic, parse_url

    _, topic, _ = parse_url(url)
    if not topic:
        raise YfppError(f"{url!r} names no topic: mqtt://HOST:PORT/TOPIC")
    Topic(topic)
