"""``python -m yfpp`` and the ``yfpp`` command.

The command line's modules are imported inside :func:`main`, so a Ctrl-C
while they load (the first few tenths of a second) ends the command quietly
with exit 130, as one later does, rather than with a traceback.
"""

import sys


def main() -> int:
    try:
        from yfpp.cli import main as run_command
    except KeyboardInterrupt:
        return 130
    return run_command()


if __name__ == "__main__":
    sys.exit(main())
