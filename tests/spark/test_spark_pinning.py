"""``spark_standalone.py --pin``'s helpers: one CPU per executor, inherited by what the pinned process starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from spark_pinning import cpus_allowed, descendants, executor_cpus, pin_to  # noqa: E402

linux_only = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")


def test_executor_k_gets_the_kth_lowest_cpu() -> None:
    assert executor_cpus(2, {5, 1, 3}) == [1, 3]
    assert executor_cpus(1, {7}) == [7]


def test_fewer_cpus_than_executors_is_refused_with_the_counts() -> None:
    with pytest.raises(ValueError, match=r"2 executors need 2 CPUs, this process may use 1 \(0;"):
        executor_cpus(2, {0})


@linux_only
def test_a_pinned_child_and_its_children_run_on_that_cpu_alone() -> None:
    cpu = min(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.run(['sleep', '30'])"],
                             preexec_fn=pin_to(cpu), start_new_session=True)
    try:
        below: list[int] = []
        for _ in range(200):  # until the grandchild (sleep) is up
            below = descendants(child.pid)
            if below:
                break
            time.sleep(0.05)
        found = [cpus_allowed(pid) for pid in (child.pid, *below)]
        assert any(f and f[0] == "sleep" for f in found), found
        assert all(f and f[1] == str(cpu) for f in found), found
        assert os.sched_getaffinity(0) != {cpu} or len(os.sched_getaffinity(0)) == 1  # this process: not pinned
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def test_an_ended_process_has_no_cpus(tmp_path: Path) -> None:
    assert cpus_allowed(123, proc=tmp_path) is None
    assert descendants(1, proc=tmp_path) == []
