"""``yfpp run --workers N``: N engine processes that find one engine's matches (docs/operations.md, "Workers").

Modules: ``pool`` (the worker processes: the Spark plan's groups and slices over N engines, the sequencer, the
match lines merged), ``reading`` (a JSON-lines file read by the workers themselves, each parsing only its own lines),
``xml_reading`` (the same for an XML file of one event element a line), ``compiled`` and ``compiled_kernels`` (where
every group is keyed and a large file's lines are plain: each worker scans every block itself with a compiled pass,
numba), ``prebuilt`` (that pass compiled ahead of time into an extension module kept on the machine, loaded without
numba), ``pipes`` (the messages between the processes: pipes written by the sending thread, back-pressure, no
deadlock between two workers).
"""
