"""Extended XPath (YFilter++) for yfpp: ``parser.parse_xpath`` compiles a query to
the pattern IR, ``xpath_predicates.compile_xpath_test`` its XPath 2.0 predicates
(the common forms through ``xpath_fast_path``, the rest through elementpath)."""
