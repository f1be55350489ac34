"""Language layer: query text to the pattern IR. May import ``yfpp.errors``, ``yfpp.input`` and
``xpath_ext`` (the extended XPath language, a package of the same rank beside it).

- ``pattern``: the IR, plain frozen dataclasses (components, expressions, equivalence, window, policy,
  RETURN) and ``validate()``.
- ``sase_parser``: SASE+ text (``sase_grammar.lark``) → IR through lark's LALR parser; positioned errors.
- ``lark_tables``: both languages' parsers loaded from saved LALR tables (below both parsers);
  ``remake_tables`` rewrites the tables after a grammar changes (``python -m yfpp.language.remake_tables``).
- ``query_text``: language detection, ``@query NAME`` files, errors placed in their file and line.
- ``query_limits``: text size, nesting depth, finite numbers, component count, checked around parsing.
- ``units``: window units of both languages → seconds, exact decimals.
"""
