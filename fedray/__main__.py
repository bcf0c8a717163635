"""``python -m fedray ...``: the ``fedray`` command line (:func:`fedray.cli.console`), same exit status."""

from fedray.cli import console

if __name__ == "__main__":
    console()
