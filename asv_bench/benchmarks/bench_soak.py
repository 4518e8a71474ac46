"""The soak scenario's engine loop (tokcy.bench.soak), short enough for asv.

``peakmem_soak``: peak resident memory of the process over 20,000 engine iterations (the
interpreter and imports included). ``track_rss_growth``: RSS growth between the first
sample (after 5,000 iterations) and the last (after 20,000): flat means nothing leaks.
``track_iterations_per_second``: the loop's throughput, prepare_inputs and the connector
included. The 10^6-iteration run is ``python -m tokcy bench --scenario soak``.
"""

from tokcy.bench.soak import soak

from ._common import BACKENDS, use_backend

ITERATIONS = 20_000
SAMPLE_EVERY = 5_000


class Soak:
    params = (BACKENDS,)
    param_names = ["backend"]
    timeout = 600

    def setup(self, backend):
        self.module = use_backend(backend)

    def peakmem_soak(self, backend):
        soak(self.module, ITERATIONS, SAMPLE_EVERY)

    def track_rss_growth(self, backend):
        _, samples, _ = soak(self.module, ITERATIONS, SAMPLE_EVERY)
        return samples[-1][1] - samples[1][1]

    track_rss_growth.unit = "MiB"

    def track_iterations_per_second(self, backend):
        seconds, _, _ = soak(self.module, ITERATIONS, SAMPLE_EVERY)
        return ITERATIONS / seconds

    track_iterations_per_second.unit = "iterations/s"
