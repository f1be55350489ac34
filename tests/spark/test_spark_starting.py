"""``yfpp spark`` starts its JVM while it reads the queries: a query error is still one line, and no JVM is left."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

ROOT = Path(__file__).resolve().parents[2]


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the JVM by its command line in /proc")
@pytest.mark.parametrize("bad_first", [True, False], ids=["at once", "after 300 good queries"])
def test_a_query_error_is_one_line_and_kills_the_starting_jvm(tmp_path, bad_first):
    good = "".join(f"@query s{k}\n[tag_id]&&//shelf[@zone='Z{k}']//exit&&(1 hour)\n" for k in range(300))
    (tmp_path / "q.xpe").write_text(good)
    bad = "PATTERN SEQ(a x, b y"
    order = ["-q", bad] if bad_first else ["-q", str(tmp_path / "q.xpe"), "-q", bad]
    marker = f"spark.yfpp.test={uuid.uuid4().hex}"  # on the JVM's command line (spark-submit --conf)
    proc = subprocess.run([sys.executable, "-m", "yfpp.cli", "spark", *order, "-i", str(tmp_path), "-o",
                           str(tmp_path / "out"), "--master", "local[1]", "--conf", marker],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    assert proc.stderr.startswith("yfpp: error: query 'q', line 1, column 21: unexpected end of query"), proc.stderr
    assert "WARN" not in proc.stderr and "log4j" not in proc.stderr  # the JVM's start-up messages dropped
    deadline = time.monotonic() + 10
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_with(marker)
    assert not (tmp_path / "out").exists()


class _Builder:
    """A stand-in for ``SparkSession.builder`` once a JVM is up: ``getOrCreate`` gives ``result`` or raises it."""

    def __init__(self, result):
        self._options, self.result = {}, result

    def getOrCreate(self):
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


@pytest.mark.parametrize("quiet, failure, shown", [(True, None, ""), (False, None, "WARN NativeCodeLoader\n"),
                                                   (True, OSError("no Java"), "WARN NativeCodeLoader\n")],
                         ids=["quiet", "log on", "quiet, the start failed"])
def test_a_quiet_start_drops_what_the_jvm_said_while_starting_unless_it_failed(spark, capsys, quiet, failure, shown):
    import io

    from yfpp.spark.starting import StartingSession

    starting = StartingSession(_Builder(failure or spark), quiet)  # (the tests' JVM is up: no JVM is launched)
    starting._pass_on(io.BytesIO(b"WARN NativeCodeLoader\n"))  # what the JVM said while it started
    if failure is None:
        assert starting.result() is spark
    else:
        with pytest.raises(OSError):
            starting.result()
    assert capsys.readouterr().err == shown
    starting._pass_on(io.BytesIO(b"said later\n"))  # once the session is up, everything goes through
    assert capsys.readouterr().err == "said later\n"
