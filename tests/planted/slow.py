"""The naive decode taking several times its step: before each step it runs the same step
:data:`TIMES` - 1 more times on a copy of the inputs (the output and the pool it writes are the
real step's, so it is correct). A slowdown far outside any run-to-run noise, on a CPU as on a GPU:
the gate must call it slower in both of its forms."""

from kda_impls.impls.naive import NaiveTorch

TIMES = 8


class SeveralTimesSlower(NaiveTorch):
    name = "planted-slow"
    library = "planted"

    def _launcher(self, inputs, out):
        launch = super()._launcher(inputs, out)
        copy = super()._launcher(inputs.clone(), out.clone())

        def slow():
            for _ in range(TIMES - 1):
                copy()
            return launch()

        return slow
