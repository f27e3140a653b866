"""The naive decode with the decay of key channel 0 forgotten in every value head: g = 0 there (its
softplus fed -1e4), so that channel's state never decays. One step's error is large enough for the
one-step check; the planted bug is that a channel's rule is lost, not its size."""

from dataclasses import replace

from kda_impls.impls.naive import NaiveTorch


class ForgetsDecay(NaiveTorch):
    name = "planted-decay"
    library = "planted"

    def _launcher(self, inputs, out):
        dt_bias = inputs.dt_bias.clone()
        dt_bias.view(inputs.HV, inputs.K)[:, 0] = -1e4  # softplus(a - 1e4) = 0: exp(g) = 1
        return super()._launcher(replace(inputs, dt_bias=dt_bias), out)
