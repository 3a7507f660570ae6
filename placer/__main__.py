"""``python -m placer``: the same as the ``placer`` command."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
