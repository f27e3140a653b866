"""The naive decode whose output passes through a helper module (``helper.py`` beside it) and reads
a ``KDA_*`` setting: what a resumed sweep must see change. Kept importable as a package of its own
(relative import), so that a test copies it with its helper and edits the copy:

- ``Helped``: correct while the helper returns the output as it is and ``KDA_PLANTED_FACTOR`` is unset;
- ``Doubled``: the same file's second class, its output twice the true one (wrong).
"""

import os

from kda_impls.impls.naive import NaiveTorch

from . import helper


class Helped(NaiveTorch):
    name = "planted-helped"
    library = "planted"

    def _launcher(self, inputs, out):
        launch = super()._launcher(inputs, out)
        factor = float(os.environ.get("KDA_PLANTED_FACTOR", "1"))

        def run():
            result = launch()
            helper.finish(out).mul_(factor)
            return result

        return run


class Doubled(Helped):
    name = "planted-doubled"

    def _launcher(self, inputs, out):
        launch = super()._launcher(inputs, out)

        def run():
            result = launch()
            out.mul_(2)
            return result

        return run
