"""One rank of a commbench job: ``python -m launch -np N --module lab.commbench.rank -- ARGS``.

Started by the commbench front end (``python -m lab commbench``), never by hand.
"""

from __future__ import annotations

import argparse
import sys

from .exchanges import add_rank_arguments, run_rank


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="commbench.rank", description=__doc__.split("\n\n")[0])
    add_rank_arguments(p)
    return run_rank(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
