"""Our Triton KDA decode kernels (``triton``), one module each.

``kernel`` (the implementation: which kernel a step runs), ``gate`` (the math they share),
``inplace`` (the one-token step), ``multitoken`` (T tokens, and frozen verify's recurrence),
``frozen`` (frozen verify in closed form), ``replay`` (a ``ReplayCache``'s steps), ``tiles`` (tile
configs and the table lookup) and ``tuning`` (the table's file, ``tuning.json``).
"""
