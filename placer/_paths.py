"""Where placer's shipped data files live (installed or in a checkout)."""

from __future__ import annotations

from pathlib import Path


def data_dir() -> Path:
    """The shipped ``datasets/`` folder: ``placer/_data`` in an installed wheel,
    the repository's ``datasets/`` in a checkout or editable install."""
    here = Path(__file__).resolve().parent
    installed = here / "_data"
    if installed.is_dir():
        return installed
    return here.parent / "datasets"
