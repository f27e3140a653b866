"""The naive decode under a name of its own: a correct implementation registered from outside."""

from kda_impls.impls.naive import NaiveTorch


class Correct(NaiveTorch):
    name = "planted-correct"
    library = "planted"
