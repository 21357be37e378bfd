"""The scripts in docs/ that make a page's numbers, loaded as modules, with the page they feed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def load_script(path):
    """A script of the repository (docs/, benchmarks/) loaded as a module named for its file;
    registered in sys.modules, so dataclasses and pickling inside it work as when it is run."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def doc_script(script: str, page: str):
    """(docs/<script> loaded as a module, the text of docs/<page>)."""
    return load_script(DOCS / script), (DOCS / page).read_text(encoding="utf-8")


def numbers_script():
    """(docs/make_decomposition_numbers.py as a module, the text of docs/decomposition.md)."""
    return doc_script("make_decomposition_numbers.py", "decomposition.md")
