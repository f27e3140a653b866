"""The implementations, one file each, every one a subclass of :class:`kda_impls.Implementation`.

They are imported by name through :mod:`kda_impls.registry`, never from here: a missing optional
library then affects only its own entry.
"""
