"""A differential soak of the plain-line XML readers (not collected by pytest: run it by hand).

    python tests/input/soak_xml_lines.py SECONDS SEED

Random feeds — mostly plain lines ``<tag ts="digits" name="value" …/>``, some spoilt by odd names, values,
quotes, namespaces, entities, text or control characters — read in random chunk sizes three ways: as they
are (so :class:`yfpp.input.xml_lines.JsonLines` takes the blocks it can), with ``JsonLines`` refusing every block
(lxml's parser target reads them), and by the splitter alone. Every event (seq, type, ts, typed attributes,
line, element, texts) and every dead letter must be the same; the first difference is printed and ends the
run with status 1. ``tests/input/test_xml_reader.py`` holds the bounded property tests of the same comparison.
"""

from __future__ import annotations

import io
import random
import re
import sys
import time
from typing import Any

from yfpp.input import xml_lines
from yfpp.input import xml_reader
from yfpp.input.dead_letters import DeadLetters
from yfpp.input.readers import read_xml

_ALPHABET = list("abcXYZ_-.0123456789eE+-") + [" ", "\t", "=", '"', "'", "<", ">", "/", "&", "\\", "é", "\u00a0",
                                                "\ufffe", "\x7f", "\x01", ";", ":", "#", "\U0001f600"]
_NAMES = ["a", "b", "tag_id", "zone", "x.y", "_z", "ts", "xmlns", "xml", "é", "1a", "a:b", "", "a b"]
_TAGS = ["shelf", "exit", "e", "p:e", "é", "1e", "a-b.c", "yfpp-batch"]


def _text(r: random.Random, n: int) -> str:
    return "".join(r.choice(_ALPHABET) for _ in range(r.randint(0, n)))


def _plain_line(r: random.Random) -> str:
    names = r.sample(["a", "tag_id", "zone", "door", "x.y", "_z"], r.randint(0, 3))
    values = [r.choice([str(r.randint(0, 10 ** 6)), "Z4", "007", "1.5", "-3", "é è", "x>y", "a=b", "1e400",
                        str(r.randint(0, 2 ** 70))]) for _ in names]
    attrs = "".join(f' {k}="{v}"' for k, v in zip(names, values))
    return f'<{r.choice(["shelf", "exit", "register"])} ts="{r.randint(0, 10 ** 9)}"{attrs}/>'


def _odd_line(r: random.Random) -> str:
    attrs = [("ts", r.choice([str(r.randint(0, 10 ** 16)), "0005", "1.5", " 3", "x", ""]))] if r.random() < 0.9 else []
    for _ in range(r.randint(0, 4)):
        value = r.choice([str(r.randint(-10 ** 20, 10 ** 20)), str(r.random() * 10 ** r.randint(-10, 30)),
                          _text(r, 6), "007", "-0", "1e5", " 7", "", "Z4"])
        attrs.append((r.choice(_NAMES), value))
    if r.random() < 0.1:
        r.shuffle(attrs)
    space = lambda: r.choice([" ", " ", " ", "  ", "\t"])  # noqa: E731
    body = "".join(f"{space()}{k}{r.choice(['=', '=', ' = '])}" + (f'"{v}"' if r.random() < 0.97 else f"'{v}'")
                   for k, v in attrs)
    return "<" + r.choice(_TAGS) + body + r.choice(["/>", "/>", "/>", " />", ">", "/"])


def _line(r: random.Random, spoil: float) -> str:
    if r.random() < spoil * 0.3:
        return _text(r, 30)
    return _odd_line(r) if r.random() < spoil else _plain_line(r)


class _Chunks(io.RawIOBase):
    """A stream that returns 1 to ``most`` bytes a read (a socket feed)."""

    def __init__(self, data: bytes, seed: int, most: int):
        self.data, self.pos, self.rng, self.most = data, 0, random.Random(seed), most

    def readable(self) -> bool:
        return True

    def read1(self, n: int = -1) -> bytes:
        out = self.data[self.pos:self.pos + self.rng.randint(1, self.most)]
        self.pos += len(out)
        return out

    read = read1


def _read_all(data: bytes, chunk: int | None, unit: str) -> tuple[list[Any], str]:
    out = io.StringIO()
    source = io.BytesIO(data) if chunk is None else _Chunks(data, 7, chunk)
    events = [(e.seq, e.type, e.ts, type(e.ts), sorted((k, repr(v), type(v).__name__) for k, v in e.attrs.items()),
               e.element.sourceline, e.element.tag, sorted(e.element.attrib.items()),
               e.texts is None or e.texts == dict(e.element.attrib))
              for e in read_xml(source, dead_letters=DeadLetters(out), ts_unit=unit)]
    return events, out.getvalue()


def _without_invented_prefixes(read: Any) -> str:
    return re.sub(r"ns\d+", "nsN", repr(read))  # (lxml numbers the prefixes it invents, parse by parse)


def main(seconds: float, seed: int) -> int:
    r = random.Random(seed)
    end = time.monotonic() + seconds
    examples = taken = 0
    json_read = xml_lines.JsonLines.read
    while time.monotonic() < end:
        spoil = r.choice([0.0, 0.0, 0.02, 0.1, 0.5])
        lines = [_line(r, spoil) for _ in range(r.randint(2, 40))]
        indent = r.choice(["", "  ", "\t"])
        head, tail = r.choice([("<stream>\n", "</stream>\n"), ("", ""), ('<?xml version="1.0" encoding="UTF-8"?>\n<s>\n', "</s>\n")])
        data = (head + "".join(indent + line + "\n" for line in lines) + tail).encode()
        unit, chunk = r.choice(["s", "ms"]), r.choice([None, 50, 200, 1000])
        took: list[bool] = []

        def counted(self: Any, *args: Any) -> Any:
            events = json_read(self, *args)
            took.append(events is not None)
            return events

        xml_lines.JsonLines.read = counted
        try:
            first = _read_all(data, chunk, unit)
            xml_lines.JsonLines.read = lambda self, *args: None
            second = _read_all(data, chunk, unit)
        finally:
            xml_lines.JsonLines.read = json_read
        whole_lines = xml_reader.Splitter._whole_lines
        xml_reader.Splitter._whole_lines = lambda self: None
        try:
            third = _read_all(data, chunk, unit)
        finally:
            xml_reader.Splitter._whole_lines = whole_lines
        examples += 1
        taken += any(took)
        if first != second or _without_invented_prefixes(first) != _without_invented_prefixes(third):
            print(f"difference on {data!r} (chunk {chunk}, unit {unit}):", first, second, third, sep="\n", file=sys.stderr)
            return 1
    print(f"seed {seed}: {examples:,} examples, JsonLines took a block in {taken:,}, no difference")
    return 0


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]), int(sys.argv[2])))
