"""Where the CPU of ``yfpp run --workers N`` goes, per process: the parent and each worker, user and system.

Runs ``python -m yfpp run -q QUERY -i FEED --workers N -o /dev/null`` for N = 1 and 2 in turn (``--repeat``
rounds, so that both see the same minutes of a shared host), the feeds of :mod:`workers_benchmark`. While a
command runs, ``/proc`` of it and its descendants is read every 20 ms; each process's last reading gives its
user and system CPU, minor page faults and context switches (voluntary: it waited; involuntary: it was
preempted). The tree's figures are the kernel's ``wait4`` accounting. Start-up (``--events 1000``) is
measured alike, so that a worker's CPU can be set against one engine's beyond its start.

    python benchmarks/workers_processes.py --events 1000000 --repeat 3
    python benchmarks/workers_processes.py --events 1000000 --pin 0    # every process on CPU 0 (taskset)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workers_benchmark import ROOT, feed, query

TICK = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.02


@dataclass
class Usage:
    """One process's figures (CPU in seconds)."""

    user: float
    sys: float
    minflt: int
    voluntary: int = 0
    involuntary: int = 0

    @property
    def cpu(self) -> float:
        return self.user + self.sys


def _read(pid: int) -> tuple[int, Usage] | None:
    """The parent pid and the figures of process ``pid`` (None: gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    f = stat[stat.rindex(")") + 2:].split()
    switches = dict(line.split(":\t") for line in status.splitlines() if "ctxt_switches" in line)
    return int(f[1]), Usage(int(f[11]) / TICK, int(f[12]) / TICK, int(f[7]),
                            int(switches.get("voluntary_ctxt_switches", 0)),
                            int(switches.get("nonvoluntary_ctxt_switches", 0)))


def per_process(cmd: list[str]) -> tuple[list[Usage], Usage]:
    """Each process of ``cmd``'s tree (the command first, then its descendants as they appeared), and the tree's."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL)
    seen: dict[int, Usage] = {}
    while True:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
        read = {pid: got for pid in pids if (got := _read(pid)) is not None}
        tree, grew = {proc.pid}, True
        while grew:
            kids = {pid for pid, (ppid, _) in read.items() if ppid in tree} - tree
            tree |= kids
            grew = bool(kids)
        for pid in sorted(tree):
            if pid in read:
                seen[pid] = read[pid][1]
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(SAMPLE_S)
    if status:
        raise SystemExit(f"{' '.join(cmd)}: exit status {status}")
    whole = Usage(ru.ru_utime, ru.ru_stime, ru.ru_minflt, ru.ru_nvcsw, ru.ru_nivcsw)
    return [seen[pid] for pid in sorted(seen)], whole


def command(events: int, n: int, pin: str | None) -> list[str]:
    run = [sys.executable, "-m", "yfpp", "run", "-q", query("keyed"), "-i", str(feed("keyed", events)),
           "--workers", str(n), "-o", os.devnull, "--progress", "never"]
    return (["taskset", "-c", pin] if pin else []) + run


def row(label: str, u: Usage) -> str:
    return f"| {label} | {u.user:.2f} | {u.sys:.2f} | {u.minflt:,} | {u.voluntary:,} | {u.involuntary:,} |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pin", help="CPUs every process runs on (taskset -c)")
    args = ap.parse_args()
    os.environ["PYTHONHASHSEED"] = "0"
    os.environ["PYTHONPATH"] = str(ROOT)
    start = statistics.median(per_process(command(1000, 1, args.pin))[1].cpu for _ in range(3))
    print(f"start-up (1,000 events, N = 1): {start:.2f} CPU s")
    print("| process | user s | sys s | minor faults | voluntary switches | involuntary switches |")
    print("|---|---:|---:|---:|---:|---:|")
    shares = []
    for r in range(args.repeat):
        load = os.getloadavg()[0]
        _, one = per_process(command(args.events, 1, args.pin))
        print(row(f"round {r + 1} (load {load:.1f}): N = 1", one))
        procs, two = per_process(command(args.events, 2, args.pin))
        procs = procs[-3:]  # (the parent and its two workers: a taskset's own process, if any, execs the parent)
        for label, u in zip(("N = 2 parent", "N = 2 worker 0", "N = 2 worker 1"), procs):
            print(row(label, u))
        print(row("N = 2 tree", two))
        beyond = one.cpu - start  # (too few events: within start-up's spread, no share)
        share = max(u.cpu for u in procs[1:]) / beyond if beyond > start else None
        shares += [share] if share is not None else []
        print(f"| tree N = 2 / N = 1 {two.cpu / one.cpu:.2f}×; busiest worker / N = 1 beyond start-up "
              f"{'n/a' if share is None else f'{share:.2f}'} | | | | | |")
    if shares:
        print(f"busiest worker / one engine beyond start-up: median {statistics.median(shares):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
