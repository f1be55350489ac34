"""JVM options for the Spark tests' JVMs: the drivers and executors of the shared session and of the jobs the
tests start as processes.

They are the options ``yfpp spark`` gives the driver JVM it starts (``DRIVER_JAVA_OPTIONS``, docs/spark.md, *A cheap
driver JVM*): the C1 compiler only and the serial collector; the tests' executors get them too. A local-cluster
session that starts and runs a few small jobs spent 29 CPU-seconds with the C1 compiler only against 49 with C2
(driver, two executors and their Python workers, on 2 cores): a test's jobs are seconds long, so C2's compilations are
spent and never paid back. What the tests check does not depend on the JIT or the collector.
"""

from __future__ import annotations

from yfpp.spark.costs import DRIVER_JAVA_OPTIONS as CHEAP_JVM

#: ``--conf`` arguments of a ``yfpp spark`` job the tests start: its executors' JVMs as cheap as its driver's
EXECUTOR_CONF = ["--conf", f"spark.executor.extraJavaOptions={CHEAP_JVM}"]

__all__ = ["CHEAP_JVM", "EXECUTOR_CONF"]
