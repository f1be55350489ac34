"""The scan plan's byte ranges (``yfpp.spark.ranges.plan_ranges``): a least range size, and what the ranges cover.

Files of any size are made sparse (``truncate``): only their sizes matter to the plan. Every splittable file is
covered by its ranges end to end, in order; no range is over ``MAX_RANGE_BYTES``, none below the least size but
a file's last; a file below the least size is one range. That the matches do not depend on where the ranges
fall is tested in tests/spark/test_spark_scan.py (``test_scan_tasks_together_equal_one_engine``, which draws
the least size too).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from yfpp.spark.ranges import MAX_RANGE_BYTES, MIN_RANGE_BYTES, ByteRange, plan_ranges  # noqa: E402

MB = 1 << 20


def files_of(folder, sizes: list[int], names: list[str]) -> list[str]:
    paths = []
    for i, (size, name) in enumerate(zip(sizes, names)):
        path = folder / f"{i}{name}"
        with open(path, "wb") as f:
            f.truncate(size)
        paths.append(str(path))
    return paths


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.one_of(st.integers(0, 3 * MB), st.integers(0, 5 * MAX_RANGE_BYTES)), min_size=1,
                      max_size=4),
       names=st.lists(st.sampled_from([".jsonl", ".json", ".xml", ".jsonl.gz"]), min_size=4, max_size=4),
       pieces=st.integers(1, 400), least=st.one_of(st.integers(1, MB), st.integers(1, MAX_RANGE_BYTES // 2)))
def test_ranges_cover_each_file_none_below_the_least_size_but_a_file_s_last(tmp_path_factory, sizes, names, pieces,
                                                                             least):
    paths = files_of(tmp_path_factory.mktemp("r"), sizes, names)
    ranges = plan_ranges(paths, None, pieces, least)
    assert [r.file for r in ranges] == sorted(r.file for r in ranges)  # stream order
    for i, (path, size) in enumerate(zip(paths, sizes)):
        mine = [r for r in ranges if r.file == i]
        if not path.endswith((".jsonl", ".json")) or size == 0:
            assert mine == [ByteRange(i, 0, None)]  # read whole, by its own reader
            continue
        assert mine[0].start == 0 and mine[-1].end == size
        assert all(a.end == b.start for a, b in zip(mine, mine[1:]))
        lengths = [r.end - r.start for r in mine]
        assert all(0 < n <= MAX_RANGE_BYTES for n in lengths)
        assert all(n >= least for n in lengths[:-1])
        if size < 2 * least:
            assert len(mine) == 1
    total = sum(s for p, s in zip(paths, sizes) if p.endswith((".jsonl", ".json")))
    if -(-total // pieces) <= MAX_RANGE_BYTES:  # about ``pieces`` ranges, or fewer (each file's last may be short)
        assert len([r for r in ranges if r.end is not None]) <= pieces + len(sizes)


def test_a_small_file_is_one_range_by_default_and_pieces_on_request(tmp_path):
    (path,) = files_of(tmp_path, [MIN_RANGE_BYTES + MB], [".jsonl"])
    assert plan_ranges([path], None, 128) == [ByteRange(0, 0, MIN_RANGE_BYTES + MB)]
    assert len(plan_ranges([path], None, 128, 1)) == 128
    assert len(plan_ranges([path], None, 3, 1)) == 3


def test_a_least_size_beyond_half_the_largest_range_is_refused(tmp_path):
    (path,) = files_of(tmp_path, [10], [".jsonl"])
    for least in (0, MAX_RANGE_BYTES // 2 + 1):
        with pytest.raises(ValueError, match="least size"):
            plan_ranges([path], None, 2, least)
