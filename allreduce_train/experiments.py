"""The experiments moved to the lab (docs/layout.md): ``python -m lab bench|scaling|...`` instead of
``python -m allreduce_train.experiments ...``; the make targets are unchanged."""

import sys

if __name__ == "__main__":
    print(
        "allreduce_train.experiments: error: the experiments moved to the lab: run `python -m lab "
        + " ".join(sys.argv[1:2] or ["--help"])
        + " ...` from the checkout (docs/layout.md)",
        file=sys.stderr,
    )
    sys.exit(2)
