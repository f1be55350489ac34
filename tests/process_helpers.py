"""Helpers for tests that run yfpp in a process of its own."""

import signal


def default_sigint() -> None:
    """A ``preexec_fn``: the child takes SIGINT as at a terminal (Python's KeyboardInterrupt), even when the
    tests themselves run with SIGINT ignored, as a background job of a shell does (a child inherits that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
