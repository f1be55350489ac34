"""Input layer: events and the readers that make them. May import ``yfpp.errors`` only.

- ``events``: ``Event`` (type, ts, attrs, seq, stream position; its XML element built on demand), the hot path's type.
- ``readers``: sources (files, stdin, gzip), format detection, ``read_events`` and ``read_event_batches`` (a
  list per 16 KiB read block, ``record_fields.READ_BLOCK``).
- ``xml_reader``: a byte-level splitter cuts the feed into event elements (caps, resynchronisation), each
  parsed by a hardened lxml parser, whole runs of plain lines at once.
- ``xml_lines``: blocks of plain lines read without an XML parser: self-closing elements with attributes in
  any order and integer, decimal or ISO-8601 ts (one regex split, one orjson call), leaf-child readings (regular
  expressions), under a root's namespaces too; else through an lxml parser target.
- ``xml_parsing``: the hardened lxml parser (no DTD, entities or network) and one record parsed alone in its
  root's namespaces.
- ``line_attributes``: the attribute texts of a plain line, read back from its bytes (``Event.texts``).
- ``jsonl_reader``: JSON lines, a block of flat records by one orjson call, any other line by itself.
- ``jsonl_scan``: each line's ts and key values of a block of JSON lines, found without parsing (``--workers``).
- ``record_fields``: what both readers share: options and caps, typed values, ts units and ISO-8601.
- ``xml_element``: the XML element XPath predicates read, for events that did not come from XML.
- ``dead_letters``: malformed and late records, counted and written with seq, position and reason.
- ``generate``: the SIGMOD §6 stock stream and an RFID feed, written as XML or JSON lines.
- ``mqtt``: MQTT reading (paho-mqtt, imported when used): broker URLs, topic filters with named levels, a
  message's events, the subscribing client — shared by the service's feeds and ``yfpp spark``'s live source.
"""
