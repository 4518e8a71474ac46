"""Memory held by 256 requests grown by appends to 8,192 tokens: tokcy against Python lists.

``peakmem_grow``: peak resident memory of the benchmark process while the requests grow
(asv's peakmem measures the whole process, interpreter and imports included, so compare
``Memory`` with ``MemoryListBaseline``). ``track_bytes_per_token``: what tracemalloc counts as
still allocated after growth, divided by the tokens held (tokcy's goal: at most 5 bytes
per token on the compiled backend; a Python list pays about 36 to 40).
"""

from tokcy.bench.memory import bytes_per_token, grow, grown_tokens, makers

from ._common import BACKENDS, backend_module

NUM_REQUESTS = 256
NUM_TOKENS = 8_192


class Memory:
    """tokcy's Request, per backend."""

    params = (BACKENDS,)
    param_names = ["backend"]
    timeout = 600

    def setup(self, backend):
        self.make = makers(backend_module(backend))["tokcy"]
        self.tokens = grown_tokens(NUM_REQUESTS, NUM_TOKENS)

    def peakmem_grow(self, backend):
        grow(self.make, self.tokens)

    def track_bytes_per_token(self, backend):
        retained, _peak = bytes_per_token(self.make, NUM_REQUESTS, NUM_TOKENS)
        return retained

    track_bytes_per_token.unit = "bytes/token"


class MemoryListBaseline:
    """A Python list of int per request (the store tokcy replaces; no backend involved)."""

    timeout = 600

    def setup(self):
        self.make = makers(None)["list"]
        self.tokens = grown_tokens(NUM_REQUESTS, NUM_TOKENS)

    def peakmem_grow(self):
        grow(self.make, self.tokens)

    def track_bytes_per_token(self):
        retained, _peak = bytes_per_token(self.make, NUM_REQUESTS, NUM_TOKENS)
        return retained

    track_bytes_per_token.unit = "bytes/token"
