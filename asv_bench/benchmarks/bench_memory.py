"""Memory held by 256 requests grown by appends to 8,192 tokens: tokcy against Python lists.

``peakmem_grow``: peak resident memory of the benchmark process while the requests grow
(asv's peakmem measures the whole process, interpreter and imports included, so compare
the ``store`` rows with each other). ``track_bytes_per_token``: what tracemalloc counts as
still allocated after growth, divided by the tokens held (tokcy's goal: at most 5 bytes
per token on the compiled backend; a Python list pays about 36 to 40).
"""

from tokcy.bench.memory import bytes_per_token, grow, grown_tokens, makers

from ._common import BACKENDS, backend_module

NUM_REQUESTS = 256
NUM_TOKENS = 8_192


class Memory:
    params = (BACKENDS, ["tokcy", "list"])
    param_names = ["backend", "store"]
    timeout = 600

    def setup(self, backend, store):
        module = backend_module(backend)
        if store == "list" and backend == "python":
            # The list baseline does not depend on the backend: measured once, under "cython".
            raise NotImplementedError("the list baseline is measured under backend=cython")
        self.make = makers(module)[store]
        self.tokens = grown_tokens(NUM_REQUESTS, NUM_TOKENS)

    def peakmem_grow(self, backend, store):
        grow(self.make, self.tokens)

    def track_bytes_per_token(self, backend, store):
        retained, _peak = bytes_per_token(self.make, NUM_REQUESTS, NUM_TOKENS)
        return retained

    track_bytes_per_token.unit = "bytes/token"
