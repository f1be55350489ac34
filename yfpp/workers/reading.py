"""``yfpp run --workers N`` over a JSON-lines file: every worker reads the file and parses only its own lines.

Shipping a parsed event from one reading process to a worker costs more CPU than reading it
(benchmarks/RESULTS.md, "Workers"), so for a regular JSON-lines file each worker reads the whole file
itself. Of each block of lines, one worker finds every line's ts and routing values and the worker each
key value hashes to (:func:`scan`): the blocks come in chunks (:func:`chunk_blocks`), chunk ``c`` scanned by
worker ``c % n``, which scans its chunks a few rounds ahead of its matching and sends the scans to the
others (:class:`Relay`). Each worker then makes events only of the lines some group of its own routes to
it: a keyed group's lines whose key value hashes to it, a sliced group's lines read by its slices, all
lines of its whole groups. For keyed groups a block of the plain shape is scanned by parsing it once
(:func:`yfpp.input.jsonl_scan.parsed_scan`): the scanner makes its own lines' events of the records, and
the others parse their lines of it without the block's checks; other blocks are scanned without parsing
(:func:`yfpp.input.jsonl_scan.scan_block`). So each line is scanned once and made an event of by about
one worker; every worker reads the bytes once (a copy from the page cache).

Everything a single reader decides is decided alike: a line's ``seq`` is its record's index (the
block's first ``seq`` plus its place), dead letters are reported by one worker (the **reporter** of a
line: the worker its first group routes it to, which parses it), and no line is late while the scanned
ts never fall below the watermark — the ts of the last line an event was made of, found at each block's
end by parsing back from its last line. A block that is not scanned (a line of another shape) or whose ts
go back is parsed whole by every worker and put through one engine's reorder buffer (the
:class:`~yfpp.workers.pool.Sequencer` given), whose late events and dead letters worker 0 reports; its events
are routed by their parsed values (:func:`workers_of`), as scanned lines are.

Where every group is keyed by the same one attribute and the file is large (:data:`COMPILED_MIN_BYTES`) and
begins with plain JSON lines (:func:`compiled_spec`, numba installed), nothing is relayed: each worker scans
every block itself, just before it matches it, with the compiled line scan (:mod:`yfpp.workers.compiled`: each
line's ts and the worker its key hashes to, no parse), and parses only its own lines of it; a block that scan
does not take whole is scanned by each worker with :func:`scan`. The run then routes every key by
:func:`~yfpp.spark.plan.value_hash` (the kernel's hash), in every block, scanned or parsed; otherwise by
Python's ``hash``. Either way the workers tell each other at the end how many bytes they read.
"""

from __future__ import annotations

import math
import os
from bisect import bisect_left, bisect_right
from array import array
from itertools import compress, islice, repeat
from operator import eq, itemgetter, mod
from typing import TYPE_CHECKING, Any, BinaryIO, Callable, Hashable, Iterable, Iterator, NamedTuple, Sequence

import orjson

from yfpp.engine import Engine
from yfpp.errors import YfppError
from yfpp.input.dead_letters import DeadLetters
from yfpp.input.events import MISSING, Event
from yfpp.input.jsonl_reader import LineBlocks, parse_block, plain_events, records_of_plain_lines
from yfpp.input.jsonl_scan import parsed_scan, scan_block
from yfpp.input.readers import format_of
from yfpp.input.record_fields import ISO_8601, ReaderOptions
from yfpp.output.vocabulary import Vocabulary
from yfpp.spark.plan import Group, Slicing, value_hash

if TYPE_CHECKING:
    from yfpp.spark.line_scan import LineSpec

BLOCK = 1 << 14  #: bytes read at a time (as the reader: larger batches of events match slower)
CHUNK = 16  #: blocks a worker scans for all (chunk ``c`` of the file by worker ``c % n``), unless every group is keyed
KEYED_CHUNK = 2  #: blocks a chunk when every group is keyed (:func:`chunk_blocks`)
AHEAD = 2  #: rounds of chunks a worker scans ahead of the block it matches (so none waits on a busy peer)
COMPILED = True  #: whether keyed plans over plain JSON lines use the compiled line scan where numba is installed
#: the smallest file the compiled line scan reads with numba's JIT kernel, or first builds the prebuilt one for
#: (:mod:`yfpp.workers.prebuilt`): loading numba costs the parent, before it forks the workers, about as much CPU (half
#: a second) as the scan saves a worker over two million plain lines, about 128 MiB of a 66-byte line
#: (benchmarks/RESULTS.md, "Workers")
COMPILED_MIN_BYTES = 128 << 20
#: the smallest file the compiled line scan reads where the prebuilt kernel is built (it loads in a millisecond, numpy
#: in a tenth of a second)
PREBUILT_MIN_BYTES = 16 << 20
Routed = dict[tuple[int, int], list[Event]]  #: a block's events per (group, slice) of this worker
Owners = bytes | array  #: each line's worker (:func:`owner_array`)


def reads_itself(path: str, fmt: str | None, opts: ReaderOptions, groups: list[Group],
                 head: bytes | None = None) -> bool:
    """Whether the workers can read ``path`` themselves: a regular, uncompressed JSON-lines file with numeric
    times, and every keyed group keyed by one top-level attribute (not the type or ts field). ``head``: the file's
    :func:`file_head` where the caller has it (None: read here)."""
    head = head if head is not None else file_head(path)
    if head is None or opts.unit is ISO_8601:
        return False
    fmt = file_format(path, fmt, head)
    fields = {opts.ts_field, opts.type_field or "type", "seq"}
    return fmt == "jsonl" and all(len(g.key) == 1 and "." not in g.key[0] and g.key[0] not in fields
                                  for g in groups if g.key)


def compiled_spec(opts: ReaderOptions, groups: list[Group], head: bytes, size: int) -> LineSpec | None:
    """What the compiled line scan looks for where the workers reading a file (:func:`reads_itself`; ``head``: its
    first bytes, ``size``: its length) each scan every block themselves with it (:mod:`yfpp.workers.compiled`): every
    group keyed by the same one attribute, numba installed (:data:`COMPILED`), a file whose first lines are plain, of
    at least :data:`COMPILED_MIN_BYTES` or, where the prebuilt kernel is built, :data:`PREBUILT_MIN_BYTES`; else None
    (the scans relayed).
    Decided once, before the workers start (the kernel loaded here, so that none of them loads it), as the routing
    hash of the whole run (:func:`~yfpp.spark.plan.value_hash` where compiled, else Python's)."""
    keys = {g.key for g in groups}
    if not COMPILED or len(keys) != 1 or () in keys or size < PREBUILT_MIN_BYTES:
        return None
    from yfpp.workers.compiled import plain_head_spec  # (numpy, and numba: imported only where they may serve)

    return plain_head_spec(head, opts, next(iter(keys))[0], build=size >= COMPILED_MIN_BYTES)


def file_head(path: str) -> bytes | None:
    """The first 4 KiB of ``path`` when it is a regular file, not gzip, else None."""
    if path == "-" or not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    return None if head[:2] == b"\x1f\x8b" else head


def file_format(path: str, fmt: str | None, head: bytes) -> str:
    """The format of the file ``path`` (``head``: its first bytes): ``fmt`` when given, else by its name, else
    ``jsonl`` or ``xml`` by its first byte (else "")."""
    first = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    return (fmt or format_of(path) or ("jsonl" if first == b"{" else "xml" if first == b"<" else "")).lower()


def chunk_blocks(groups: Sequence[Group]) -> int:
    """Blocks a chunk of a JSON-lines file for ``groups``: :data:`KEYED_CHUNK` when every group is keyed, else
    :data:`CHUNK`. A worker holds the blocks, and the records its scans parsed, of the chunks it reads ahead
    (``AHEAD * n + 1`` chunks): where every block's events split over the workers they go in step, and short
    chunks keep what is held in the processor's cache (benchmarks/RESULTS.md, "Workers"); a time slice or a whole
    group keeps one worker busy while the others run ahead, as far as the chunks scanned ahead let them. (An XML
    scan keeps no records: XML keeps :data:`CHUNK`.)"""
    return KEYED_CHUNK if groups and all(g.key for g in groups) else CHUNK


def plan_slices(groups: list[Group], sliced: Any, ts: list[float], slice_events: float, last: float | None = None,
                n: int = 1) -> dict[int, Slicing | None]:
    """Each sliced group's slices (``sliced``: their indexes), from the first ts of the stream's first batch,
    about ``slice_events`` events long at that batch's rate (``ts``), at least the group's window (None: one
    slice, when the window is 0). ``last``: the stream's last ts where it is known (a file's last line); then
    the slices up to it are a little shorter, as many as deal evenly to the ``n`` workers (:func:`even_length`)."""
    t0, t1 = (ts[0], ts[-1]) if ts else (0.0, 0.0)
    rate = (len(ts) - 1) / (t1 - t0) if t1 > t0 else 0.0
    plans: dict[int, Slicing | None] = {}
    for g in sliced:
        w = groups[g].window
        length = max(w, slice_events / rate if rate else w)
        if last is not None and last > t0 and length > 0:
            length = max(w, even_length(last - t0, n, length))
        plans[g] = Slicing(t0, length, w) if length > 0 else None
    return plans


def even_length(span: float, n: int, length: float) -> float:
    """A slice length, at most about ``length``, that cuts ``span`` into slices a multiple of ``n`` in number (the end
    of the span inside the last of them): dealt round-robin, each of ``n`` workers matches as many of them (3 slices
    of 2 workers put two thirds of the matching on one)."""
    return span / (n * math.ceil(span / (n * length)) - 1e-6)


def last_ts(fd: int, size: int, opts: ReaderOptions) -> float | None:
    """The ts of the last line of the JSON-lines file open as ``fd`` (``size`` bytes) that the reader makes an event
    of, among its last :data:`BLOCK` bytes (None: none), read without moving the file's position."""
    tail = os.pread(fd, BLOCK, max(0, size - BLOCK))
    lines = tail.split(b"\n")[size > BLOCK:]  # (the first piece of a tail: part of a line)
    for line in reversed(lines):
        events, _, _ = parse_block(line, 0, 0, opts, DeadLetters())
        if events:
            return events[0].ts
    return None


class Scan(NamedTuple):
    """What :func:`scan` finds in a block of ``size`` bytes. When it is scanned (every line of the shape
    :func:`~yfpp.input.jsonl_scan.scan_block` takes, the times never going back): each line's ``ts``, per
    routing key each line's worker (``owners``: :func:`workers_of` its key value, a compact array, which a
    worker sends its peers as a byte a line), the ts and index of the
    ``last`` line the reader makes an event of (None: none), and whether each line is an object with no object
    in it (``flat``: an event of a line then has each routing attribute the scan found, but where ``plain`` a null
    value, which makes the line no plain event); else ``ts`` is None.
    ``plain``: every line has the plain shape of :func:`~yfpp.input.jsonl_reader.plain_records` (any of them
    parsed without its checks); ``records``: the lines' records the scan parsed (kept by the scanning worker,
    never sent: None in the peers' scans); ``lines``: the block's lines, where scanned; ``own``: the scanning
    worker's lines as one JSON array, where the compiled line scan took the block (:func:`compiled_scan`: every
    worker scans the block itself). The peers get ``ts`` as a compact array, and only its first where every group
    is keyed (:meth:`Relay.sent`: only a time slice looks at the others)."""

    size: int
    ts: Sequence[float] | None
    owners: list[Owners]
    last: tuple[float, int] | None
    flat: bool = False
    plain: bool = False
    records: list[dict[str, Any]] | None = None
    lines: int = 0
    own: bytes | None = None


def scan(body: bytes, opts: ReaderOptions, keys: Sequence[str], n: int,
         route: Callable[[Any], int] = hash) -> Scan:
    """The :class:`Scan` of a block of complete lines, for ``n`` workers (``route``: the run's routing hash,
    :func:`workers_of`): for keyed groups, the block parsed once where it has the plain shape (its records kept,
    :func:`~yfpp.input.jsonl_scan.parsed_scan`), else found by regular expressions
    (:func:`~yfpp.input.jsonl_scan.scan_block`)."""
    parsed = parsed_scan(body, opts) if keys else None
    if parsed is not None:
        ts, records = parsed
        if not _ordered(ts):
            return Scan(len(body), None, [], None)
        try:  # (any value of a flat object hashes as the engine compares it: 1, 1.0 and true alike)
            owners = [workers_of(map(itemgetter(name), records), n, route) for name in keys]
        except KeyError:  # (a line naming a key as a value only: the regular expressions decide)
            owners = None
        if owners is not None:
            return Scan(len(body), ts, owners, _last_event(body, len(ts), opts, records[-1]), True, True, records,
                        len(ts))
    found = scan_block(body, opts, keys)
    if found is None or not _ordered(found[0]):
        return Scan(len(body), None, [], None)
    ts, values = found
    # (flat: one `{` a line, the first byte of each; only keyed groups look at it)
    flat = bool(keys) and body[:1] == b"{" and body.count(b"\n{") == len(ts) - 1 and body.count(b"{") == len(ts)
    return Scan(len(body), array("d", ts), [workers_of(vs, n, route) for vs in values], _last_event(body, len(ts), opts),
                flat, lines=len(ts))


def compiled_scan(body: bytes, spec: LineSpec, opts: ReaderOptions, keys: Sequence[str], n: int, me: int) -> Scan:
    """Worker ``me`` of ``n``'s :class:`Scan` of a block of complete lines, where every group is keyed by ``keys[0]``
    (:func:`compiled_spec`): where every line is plain, none over the reader's ``max_record_bytes`` and the ts never go
    back, each line's ts and worker from the compiled scan (:func:`yfpp.workers.compiled.owned`; the lines left
    unparsed, each a plain event: the block's last line its last event) and the worker's own lines gathered by it;
    else :func:`scan`'s, routed by :func:`~yfpp.spark.plan.value_hash` as well."""
    from yfpp.workers.compiled import owned  # (numpy and numba, loaded before the workers started: compiled_spec)

    taken = owned(body, spec, n, opts.max_record_bytes, me)
    if taken is None:
        return scan(body, opts, keys, n, value_hash)
    ts, owners, own = taken
    return Scan(len(body), ts, [owners], (float(ts[-1]), len(ts) - 1), True, True, None, len(ts), own)


def _last_event(body: bytes, lines: int, opts: ReaderOptions,
                last: dict[str, Any] | None = None) -> tuple[float, int] | None:
    """The ts and index of the last of the block's ``lines`` lines that the reader makes an event of (None: none);
    ``last``: the last line's record where the block has the plain shape (a plain event: the last event)."""
    if last is not None and (events := plain_events([dict(last)], (0,), opts)):
        return events[0].ts, lines - 1
    end = len(body) - (body[-1:] == b"\n")
    for j in range(lines - 1, -1, -1):  # (parsed from the end back: a line of the shape may be no event)
        start = body.rfind(b"\n", 0, end) + 1
        events, _, _ = parse_block(body[start:end], 0, 0, opts, DeadLetters())
        if events:
            return events[0].ts, j
        end = start - 1
    return None


def workers_of(values: Iterable[Hashable], n: int, route: Callable[[Any], int] = hash) -> Owners:
    """Each key value's worker of ``n``: its hash (``route``: Python's, in C with no Python step per value, or
    :func:`~yfpp.spark.plan.value_hash` where the compiled line scan routes the run) modulo ``n``. Values equal in
    Python (``1``, ``1.0``, ``True``) hash alike, so one key goes to one worker however it is written."""
    return owner_array(map(mod, map(route, values), repeat(n)), n)


def owner_array(owners: Iterable[int], n: int) -> Owners:
    """Workers of ``n`` as compact as they go to the peers: ``bytes`` where each fits a byte (a worker's lines then
    flagged in one C pass, :func:`flags_of`), else an ``I`` array."""
    return bytes(owners) if n <= 256 else array("I", owners)


def flags_of(owners: Owners, me: int) -> Sequence[int]:
    """1 for each of ``owners`` that is ``me``, else 0 (truth values, as ``compress`` takes them)."""
    if type(owners) is bytes:
        return owners.translate(_ONE_AT[me])
    return bytes(map(eq, owners, repeat(me)))


_ONE_AT = [bytes(i == me for i in range(256)) for me in range(256)]  #: per worker, a table of 1 at it, 0 elsewhere


class Relay:
    """Worker ``me`` of ``n``'s reading of the file: :meth:`blocks_read` gives each block with its :class:`Scan`. The
    blocks are read once, by ``blocks`` (an iterator of a block's bytes; ``marks``: what the reader set aside while
    reading the block it just gave, taken with it), a chunk of ``chunk`` blocks (None: :data:`CHUNK`, as it is then)
    at a time (``every_ts``: the peers' groups look at each line's ts, :meth:`sent`), up to :data:`AHEAD` rounds of chunks ahead of the block given; its own chunks (chunk ``c`` by worker
    ``c % n``) are scanned as they are read, each chunk's scans sent to the others' ``inboxes``; the others' chunks'
    scans come from its inbox
    (``inboxes[me]``). At the end of the file each worker tells the others how many chunks and bytes it read, so
    none waits for a chunk its scanner never read, and all read the same bytes (:meth:`same_file`). ``alone``: each
    worker scans every chunk itself as it comes to it (the compiled line scan, :mod:`yfpp.workers.compiled`), and
    sends the others nothing but its end."""

    def __init__(self, blocks: Iterator[bytes], scanner: Callable[[bytes], Scan], me: int, n: int,
                 inboxes: Sequence[Any], marks: Callable[[], list] = list, chunk: int | None = None,
                 every_ts: bool = True, alone: bool = False):
        self.blocks, self.scanner, self.me, self.n, self.inboxes = blocks, scanner, me, n, inboxes
        self.alone = alone  # each worker scans every block itself, just before it is matched: only the ends are sent
        self.marks, self.chunk_size = marks, CHUNK if chunk is None else chunk
        self.every_ts = every_ts  # the peers look at every line's ts (a time slice), not just the first
        self.read = 0  # the chunks read
        self.size = 0  # their bytes
        self.ended = False  # the end of the file reached
        self.kept: dict[int, list[Scan]] = {}  # scans of chunks not taken yet (own, and received)
        self.bodies: dict[int, list[tuple[bytes, list]]] = {}  # the blocks of chunks not taken yet, and their marks
        self.ends: dict[int, tuple[int, int]] = {}  # per worker that reached the end of the file: chunks, bytes read
        self.trailing: list = []  # the marks after the last block

    def blocks_read(self) -> Iterator[tuple[bytes, list, Scan | None]]:
        """Each block read, the marks before it, and its scan (None: the scan is of other bytes, or missing: the
        file changed while it was read)."""
        c = 0
        while True:
            scans = self.chunk(c)
            bodies = self.bodies.pop(c, None)
            if bodies is None:
                return
            for b, (body, marks) in enumerate(bodies):
                sc = scans[b] if b < len(scans) else None
                yield body, marks, sc if sc is not None and sc.size == len(body) else None
            c += 1

    def chunk(self, c: int) -> list[Scan]:
        """The scans of chunk ``c``'s blocks (fewer, or none, at the end of the file)."""
        me, n = self.me, self.n
        while self.read <= c + (0 if self.alone else AHEAD * n) and not self.ended:
            got = [(body, self.marks()) for body in islice(self.blocks, self.chunk_size)]
            self.ended = not got
            if self.ended:
                self.trailing = self.marks()
                self._send(self.read, None)
                continue
            self.bodies[self.read] = got
            self.size += sum(len(body) for body, _ in got)
            if self.alone or self.read % n == me:
                self._send(self.read, [self.scanner(body) for body, _ in got])
            self.read += 1
        if c % n != me and not self.alone:
            while c not in self.kept and self.ends.get(c % n, (c + 1,))[0] > c:
                self._receive()
        return self.kept.pop(c, [])

    def same_file(self) -> bool:
        """At the end of the file: whether every worker read as many bytes as this one (waiting for their ends)."""
        while len(self.ends) < self.n - 1:
            self._receive()
        return all(size == self.size for _, size in self.ends.values())

    @staticmethod
    def sent(sc: Scan, every_ts: bool = True) -> Scan:
        """``sc`` as the peers get it: without the records its scanner keeps, its ts a compact array (only the first,
        unless ``every_ts``: a plan with a time slice)."""
        if sc.ts is None or (every_ts and type(sc.ts) is array):
            return sc
        return sc._replace(ts=array("d", sc.ts if every_ts else sc.ts[:1]), records=None)

    def _receive(self) -> None:
        """A peer's next message: a chunk's scans, or its end of the file."""
        w, got, scans = self.inboxes[self.me].get()
        if scans is None:
            self.ends[w] = got
        else:
            self.kept[got] = scans

    def _send(self, c: int, scans: list[Scan] | None) -> None:
        """Chunk ``c``'s scans kept, and sent to the others (None: the end of the file, before chunk ``c``)."""
        if scans is not None:
            self.kept[c] = scans
            if self.alone:
                return
            scans = [self.sent(sc, self.every_ts) for sc in scans]
        for w, inbox in enumerate(self.inboxes):
            if w != self.me:
                inbox.put((self.me, c if scans is not None else (c, self.size), scans))


def common_reads(sl: Slicing, events: list[Event]) -> range | None:
    """The slices that read every one of ``events`` when they all are read by the same ones, else None. The events
    are in stream order, their ts never going back, and the first and the last slice that read a ts never go back
    either: when the first event and the last are read by the same slices, so is every one between them."""
    if not events:
        return None
    reads = sl.reads(events[0].ts)
    return reads if reads == sl.reads(events[-1].ts) else None


class Share:
    """Worker ``index`` of ``n``'s share of the JSON-lines file ``path``: :meth:`blocks` reads it and gives,
    per block, this worker's events per (group, slice) and the slices it may close. ``dead``: where the
    dead letters this worker reports go; ``sequencer``: an empty reorder buffer (max_delay 0) whose dead
    letters are ``dead`` in worker 0 and a quiet sink in the others; ``slicings``: filled at the first block
    (the dict the worker's matching reads); ``inboxes``: per worker, where the scans sent to it go — this worker's own
    :class:`~yfpp.workers.pipes.Inbox` at its index, an :class:`~yfpp.workers.pipes.Outbox` to each other one (put and
    get, as queues; :class:`Relay`; none for one worker); ``spec``: where each worker scans every block itself with
    the compiled line scan (:func:`compiled_spec`; None: the scans relayed)."""

    def __init__(self, path: str, opts: ReaderOptions, groups: list[Group], index: int, n: int, slice_events: int,
                 dead: DeadLetters, sequencer: Engine, slicings: dict[int, Slicing | None],
                 inboxes: Sequence[Any] = (), spec: LineSpec | None = None):
        self.path, self.opts, self.groups, self.me, self.n = path, opts, groups, index, n
        self.spec = spec
        self.route: Callable[[Any], int] = hash if spec is None else value_hash  #: the routing hash of the whole run
        self.inboxes = inboxes
        self.slice_events = slice_events
        self.dead = dead
        self.quiet = DeadLetters()
        self.sequencer = sequencer
        self.keys = sorted({g.key[0] for g in groups if g.key})
        self.slicings = slicings
        self._open = {g: 0 for g, grp in enumerate(groups) if grp.sliced}  # each sliced group's first open slice
        self.events = 0  #: the events of the lines this worker reports (summed over the workers: the input's)
        self.vocabulary = Vocabulary(pattern for g in groups for _, pattern in g.queries)
        self._started = False
        self.seq = self.lineno = 0  # where the reader stands: the next record's seq, the lines read
        self._last: float | None = None  # the ts of the file's last event, where found (the slices' plan)

    def blocks(self) -> Iterator[tuple[Routed, list[tuple[int, int]]]]:
        """This worker's events of each block read, and the (group, slice) pairs no later event is read by."""
        with open(self.path, "rb") as f:
            relay = self._relay(f)
            self._last = self._last_ts(f)
            for body, marks, sc in relay.blocks_read():
                if sc is None:
                    raise YfppError(f"{self.path} changed while the workers read it")
                self._set_aside(marks)
                if (self._plain_next() and sc.ts is not None and self._started
                        and sc.ts[0] >= self.sequencer.watermark[0]):
                    seq, lineno = self._position()
                    routed = self._scanned(body, seq, lineno, sc)
                    self._skip(sc.lines)
                else:
                    routed = self._buffered(self._read(body))
                yield routed, self._closing()
            self._set_aside(relay.trailing)
            if not relay.same_file() or f.tell() > os.fstat(f.fileno()).st_size:
                raise YfppError(f"{self.path} changed while the workers read it")
            last = self._read(b"")
            if last is not None:
                yield self._buffered(last), self._closing()

    # --- the reader's steps (JSON lines here; XML in yfpp.workers.xml_reading.XmlShare) ----------

    def _relay(self, f: BinaryIO) -> Relay:
        """The :class:`Relay` over the blocks of the open file ``f``: its marks the lines over the size cap."""
        caught = KeptDeadLetters()
        opts, keys, n = self.opts, self.keys, self.n
        if self.spec is not None:
            spec = self.spec
            me = self.me
            scanner: Callable[[bytes], Scan] = lambda body: compiled_scan(body, spec, opts, keys, n, me)
        else:
            scanner = lambda body: scan(body, opts, keys, n)
        return Relay(iter(LineBlocks(f, opts.max_record_bytes, caught, BLOCK)), scanner, self.me, n, self.inboxes,
                     caught.take, chunk_blocks(self.groups), any(g.sliced for g in self.groups), self.spec is not None)

    def _last_ts(self, f: BinaryIO) -> float | None:
        """The ts of the open file's last event, where its last lines tell (:func:`last_ts`; only sliced groups ask)."""
        return last_ts(f.fileno(), os.fstat(f.fileno()).st_size, self.opts) if self._open else None

    def _set_aside(self, marks: list[tuple]) -> None:
        """The lines over the size cap read before the next block: each a dead letter (``too large``), numbered
        where the reader stands (as :class:`~yfpp.input.jsonl_reader.LineBlocks` numbers them, reading alone)."""
        for _, _, reason, raw in marks:
            self.lineno += 1
            if self.me == 0:
                self.dead.report(self.seq, f"line {self.lineno}", reason, raw)
            self.seq += 1

    def _plain_next(self) -> bool:
        """Whether the reader would read the next block's lines as plain lines (a JSON-lines reader always can)."""
        return True

    def _position(self) -> tuple[int, int]:
        """The next record's ``seq``, and the line the next block comes after."""
        return self.seq, self.lineno

    def _skip(self, lines: int) -> None:
        """Past a scanned block of ``lines`` lines, each one record, read by :meth:`_scanned`."""
        self.seq += lines
        self.lineno += lines

    def _read(self, body: bytes) -> list[Event] | None:
        """The events of a block as the one reader reads it (dead letters: worker 0's to report); at the end of the
        file (``body`` empty), those it still holds (None: none, a JSON-lines reader holds none)."""
        if not body:
            return None
        events, self.seq, self.lineno = parse_block(body, self.seq, self.lineno, self.opts,
                                                    self.dead if self.me == 0 else self.quiet)
        return events

    def _buffered(self, events: list[Event]) -> Routed:
        """This worker's share of the events of a block every worker parsed, put through the reorder buffer."""
        if self.me == 0:
            self.events += len(events)
            self.vocabulary.note(events)
        self.sequencer.process_batch(events, [])
        released = self.sequencer.take()
        if released and not self._started:
            self._start([ev.ts for ev in released])
        return self._parsed(released)

    def _start(self, ts: list[float]) -> None:
        """The slices planned from the first events released (``ts``) to the file's last (as many as deal evenly to
        the workers)."""
        self.slicings.update(plan_slices(self.groups, self._open, ts, self.slice_events, self._last, self.n))
        self._started = True

    # --- a scanned block: parse the own lines ------------------------------------------------

    def _scanned(self, body: bytes, seq: int, lineno: int, sc: Scan) -> Routed:
        """The events of the lines of a scanned, ordered block that this worker's groups read; the watermark
        moved past the block (to its last line the reader makes an event of, and its next ``seq``)."""
        ts = sc.ts
        assert ts is not None
        count = sc.lines
        me, n = self.me, self.n
        masks: list[Sequence[int] | None] = []  # per group: which lines it routes here, truth values (None: every line)
        reporter: Sequence[int] | None = None  # per line, the worker that reports it (None: worker 0)
        for g, grp in enumerate(self.groups):
            sl = self.slicings.get(g) if grp.sliced else None
            if grp.key:
                owners = sc.owners[self.keys.index(grp.key[0])]
                masks.append(flags_of(owners, me))
                if g == 0:
                    reporter = owners
            elif sl is not None:  # (a slice's lines found by bisection, a little wide: routing takes the exact ones)
                mask = [False] * count
                owners = [0] * count
                eps = 1e-6 * sl.length + 1e-9 * abs(ts[-1])
                for s in range(sl.reads(ts[0]).start - 1, sl.own(ts[-1]) + 2):
                    start = sl.t0 + s * sl.length
                    lo, hi = bisect_left(ts, start), bisect_left(ts, start + sl.length)
                    owners[lo:hi] = [(s + g) % n] * (hi - lo)
                    if (s + g) % n == me:
                        lo = bisect_left(ts, start - eps)
                        hi = bisect_right(ts, start + sl.length + sl.window + eps)
                        mask[lo:hi] = [True] * (hi - lo)
                masks.append(mask)
                if g == 0:
                    reporter = owners  # (the slice a line is in: one that reads it)
            else:
                masks.append(None if g % n == me else [False] * count)
        every = [m for m in masks if m is not None]
        union: Sequence[int] | None = None  # which lines are parsed here, truth values (None: all)
        if len(every) == len(masks):
            union = every[0] if len(every) == 1 else list(map(any, zip(*every)))
            if 0 not in union:  # (0 == False: a list of bools or a bytes of flags alike)
                union = None
        routed: Routed = {}
        if union is None or 1 in union:
            events, keyed = self._parse(body, union, seq, lineno, reporter, sc)
            single = len(self.groups) == 1
            placed: set[int] = set()
            for g, grp in enumerate(self.groups):
                mask = masks[g]
                chosen = events if mask is None or single else [ev for ev in events if mask[ev.seq - seq]]
                if grp.key and not keyed:  # (a key named in a nested object only, or null: the event lacks it)
                    a = grp.key[0]
                    chosen = [ev for ev in chosen if a in ev.attrs]
                if single and not grp.sliced:
                    routed[(g, 0)] = chosen  # (the one engine these events go to)
                else:
                    self._place(routed, g, chosen, placed)
        if sc.last is not None:
            self.sequencer.skip_to(sc.last[0], seq + sc.last[1], seq + count)
        else:
            self.sequencer.skip_to(*self.sequencer.watermark, seq + count)
        return routed

    def _parse(self, body: bytes, union: Sequence[int] | None, seq: int, lineno: int,
               reporter: Sequence[int] | None, sc: Scan) -> tuple[list[Event], bool]:
        """The events of the block's lines ``union`` flags (None: every line; the block's first line has ``seq`` and
        comes after line ``lineno``), numbered as in the file, and whether each has every routing attribute the scan
        found; the dead letters and events of the lines this worker reports counted. Lines of the plain shape are
        made events of the records the scan parsed (``sc.records``, in the worker that scanned the block) or parsed
        without the block's checks; a line that is no plain event (a null value among them) sends them all the long
        way."""
        events = self._plain(body, union, seq, sc) if sc.plain else None
        if events is not None:
            self._count(events, seq, reporter)
            return events, True
        caught = KeptDeadLetters()
        me = self.me
        if union is None:  # (a block of lines, each a record: numbered as the file's at once)
            events, _, _ = parse_block(body, seq, 0, self.opts, caught)
            dead = [(i - seq, reason, raw) for i, _, reason, raw in caught.items]
        else:
            own = list(compress(range(len(union)), union))
            events, _, _ = parse_block(b"\n".join(compress(body.split(b"\n"), union)), 0, 0, self.opts, caught)
            if len(events) == len(own):
                for ev, j in zip(events, own):
                    ev.seq = seq + j
            else:
                for ev in events:
                    ev.seq = seq + own[ev.seq]
            dead = [(own[i], reason, raw) for i, _, reason, raw in caught.items]
        for j, reason, raw in dead:
            if (reporter[j] if reporter is not None else 0) == me:
                self.dead.report(seq + j, f"line {lineno + j + 1}", reason, raw)
        self._count(events, seq, reporter)
        return events, sc.flat and not sc.plain

    def _plain(self, body: bytes, union: Sequence[int] | None, seq: int, sc: Scan) -> list[Event] | None:
        """The events of the lines ``union`` flags of a block of the plain shape, numbered as in the file; None
        when one of them is no plain event."""
        if sc.records is not None:
            records = sc.records if union is None else compress(sc.records, union)
        elif sc.own is not None:  # (the compiled scan's: the lines of this worker, which every group keys alike)
            records = orjson.loads(sc.own)
        elif union is None:
            return None  # (every line: the reader's block parse, its checks included, costs the same)
        else:
            records = records_of_plain_lines(compress(body.split(b"\n"), union))
        seqs = range(seq, seq + sc.lines)
        return plain_events(records, seqs if union is None else compress(seqs, union), self.opts)

    def _count(self, events: list[Event], seq: int, reporter: Sequence[int] | None) -> None:
        """The events of the lines this worker reports counted (``reporter``: each line's reporting worker; None:
        worker 0)."""
        me = self.me
        if reporter is None:
            reported = events if me == 0 else []
        elif (len(self.groups) == 1 and self.groups[0].key) or reporter.count(me) == len(reporter):
            reported = events  # (its own lines are the ones it reports, or it reports every line)
        else:
            reported = [ev for ev in events if reporter[ev.seq - seq] == me]
        self.events += len(reported)
        self.vocabulary.note(reported)

    # --- a parsed block: route by the parsed values ------------------------------------------

    def _parsed(self, events: list[Event]) -> Routed:
        """This worker's share of events released in stream order (every worker has them all)."""
        routed: Routed = {}
        me, n, route = self.me, self.n, self.route
        placed: set[int] = set()
        for g, grp in enumerate(self.groups):
            if grp.key:
                a = grp.key[0]
                chosen = [ev for ev in events if (v := ev.get(a)) is not MISSING and route(v) % n == me]
            else:
                chosen = events if self.slicings.get(g) is not None or g % n == me else []  # (sliced, or whole)
            self._place(routed, g, chosen, placed)
        return routed

    def _place(self, routed: Routed, g: int, events: list[Event], placed: set[int]) -> None:
        """Group ``g``'s events of this worker into ``routed`` (a sliced group's into its slices here that read
        them); an event already placed for another engine is copied, as the runtime numbers an engine's events
        in them (``pos``); a batch all of whose events the same slices read is placed at once."""
        sl = self.slicings.get(g) if self.groups[g].sliced else None
        me, n = self.me, self.n
        if sl is not None and (reads := common_reads(sl, events)) is not None:
            mine = [s for s in reads if (s + g) % n == me]
            if len(mine) == 1 and len(self.groups) == 1:  # (the one engine here that reads them: nothing to copy)
                routed.setdefault((g, mine[0]), []).extend(events)
                return
            for s in mine:
                chosen = events if placed.isdisjoint(map(id, events)) else [
                    Event(ev.type, ev.ts, ev.attrs, ev.seq) if id(ev) in placed else ev for ev in events]
                placed.update(map(id, chosen))
                routed.setdefault((g, s), []).extend(chosen)
            return
        for ev in events:
            for s in (sl.reads(ev.ts) if sl is not None else (0,)):
                if sl is None or (s + g) % n == me:
                    if id(ev) in placed:
                        ev = Event(ev.type, ev.ts, ev.attrs, ev.seq)
                    placed.add(id(ev))
                    routed.setdefault((g, s), []).append(ev)

    def _closing(self) -> list[tuple[int, int]]:
        """This worker's slices that no event at the watermark or later reads (flushed and dropped)."""
        ts = self.sequencer.watermark[0]
        closes = []
        if ts == -math.inf:
            return closes
        for g, first in self._open.items():
            sl = self.slicings.get(g)
            if sl is None:
                continue
            upto = sl.reads(ts).start
            closes.extend((g, s) for s in range(first, upto) if (s + g) % self.n == self.me)
            self._open[g] = max(first, upto)
        return closes


class KeptDeadLetters(DeadLetters):
    """Dead letters kept as ``(seq, position, reason, raw)`` until taken: a reader's, to be numbered as in the file;
    a worker's, to go to the parent with its next matches."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[tuple] = []

    def report(self, seq: int, position: str, reason: str, raw: str | None = None) -> None:
        self.items.append((seq, position, reason, raw))

    def take(self) -> list[tuple]:
        """The dead letters kept since the last take."""
        items, self.items = self.items, []
        return items


def _ordered(ts: list[float]) -> bool:
    """Whether ``ts`` never goes back."""
    return all(a <= b for a, b in zip(ts, ts[1:])) if len(ts) < 8 else ts == sorted(ts)
