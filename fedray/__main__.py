"""``python -m fedray ...``: the ``fedray`` command line (:func:`fedray.cli.main`), same exit status."""

import sys

from fedray.cli import main

if __name__ == "__main__":
    sys.exit(main())
