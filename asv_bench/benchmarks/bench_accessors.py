"""Token buffer accessors against ``get_tokens()`` copies, for 2,048 to 131,072 tokens.

Each benchmark is one pass over a batch of 32 requests of n tokens (one engine
iteration reading every scheduled request once), so the figures stay well above the
clock's resolution. tokcy's accessors are O(1) or O(64) and stay flat in n; the
``*_by_copy`` baselines (the "before" pattern of TensorRT-LLM pull requests #16791 and
#22092: ``get_tokens(0)`` copied whole, then
``len``, a slice or the last entry) grow with n. ``time_append`` appends one token to each
request (tokcy) or to a Python list per request (``time_append_list``).
"""


from tokcy._baselines import tokens as baselines

from ._common import BACKENDS, backend_module, tokens

BATCH = 32
RANGE = 64
LENGTHS = [2_048, 8_192, 32_768, 131_072]

_requests = {}  # (backend, n) -> (requests, lists); built once per process
_checked = set()


def _batch(backend, n):
    key = (backend, n)
    if key not in _requests:
        module = backend_module(backend)
        requests, lists = [], []
        for i in range(BATCH):
            ids = tokens(n, rng_seed=i)
            requests.append(module.Request(i, ids))
            lists.append(baselines.ListTokens(ids))
        _requests[key] = (requests, lists)
    return _requests[key]


def _check(backend, n, requests):
    """Every baseline gives tokcy's answer (once per configuration and process)."""
    if (backend, n) in _checked:
        return
    for r in requests:
        assert r.get_num_tokens(0) == baselines.num_tokens_by_copy(r)
        assert r.get_tokens_range(0, n - RANGE, n) == baselines.tokens_range_by_copy(r, n - RANGE, n)
        assert r.get_last_tokens(0) == baselines.last_token_by_copy(r)
    _checked.add((backend, n))


class Accessors:
    params = (BACKENDS, LENGTHS)
    param_names = ["backend", "n"]
    timeout = 300

    def setup(self, backend, n):
        self.requests, self.lists = _batch(backend, n)
        for request, listed in zip(self.requests, self.lists):  # undo the previous sample's appends
            if request.get_num_tokens(0) != n:
                request.truncate(n)
            listed.truncate(n)
        _check(backend, n, self.requests)
        self.begin, self.end = n - RANGE, n

    def time_get_num_tokens(self, backend, n):
        for r in self.requests:
            r.get_num_tokens(0)

    def time_get_num_tokens_by_copy(self, backend, n):
        for r in self.requests:
            len(r.get_tokens(0))

    def time_get_tokens_range(self, backend, n):
        begin, end = self.begin, self.end
        for r in self.requests:
            r.get_tokens_range(0, begin, end)

    def time_get_tokens_range_by_copy(self, backend, n):
        begin, end = self.begin, self.end
        for r in self.requests:
            r.get_tokens(0)[begin:end]

    def time_get_last_tokens(self, backend, n):
        for r in self.requests:
            r.get_last_tokens(0)

    def time_get_last_tokens_by_copy(self, backend, n):
        for r in self.requests:
            r.get_tokens(0)[-1]

    def time_append(self, backend, n):
        for r in self.requests:
            r.add_new_token(1234, 0)

    def time_append_list(self, backend, n):
        for listed in self.lists:
            listed.tokens.append(1234)
