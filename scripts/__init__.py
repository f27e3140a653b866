"""The maintainer tools, grouped by purpose (scripts/README.md lists them).

Run one from the repository root as a module, with the package installed (``pip install -e .``):
``python3 -m scripts.crosscheck.nvbench_crosscheck --help``.
"""
