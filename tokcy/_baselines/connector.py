"""What an engine does without tokcy's connector loop: the two patterns of the TensorRT-LLM pull request #22092.

Both keep, per request, the tokens and block ids reported so far in Python lists (as the
engine's ``KvCacheConnectorSchedulerOutputRequest`` does) and build one ``RequestData``
per scheduled request per iteration. They are benchmark baselines, not library API. Like
the engine's code they miss a token or block rewritten at an already-reported position
(the list shrank, then grew again) and they re-send released (-1) block ids; on a steady
decode (append-only) their reports equal tokcy's, which the benchmark checks once.
"""

__all__ = ["BaselineRequestData", "BeforeSchedulerOutputManager", "AfterSchedulerOutputManager"]


class BaselineRequestData:
    """The engine's ``RequestData``: request id, new tokens, new block ids per group, computed position."""

    __slots__ = ("request_id", "new_tokens", "new_block_ids_by_group", "computed_position")

    def __init__(self, request_id, new_tokens, new_block_ids_by_group, computed_position):
        self.request_id = request_id
        self.new_tokens = new_tokens
        self.new_block_ids_by_group = new_block_ids_by_group
        self.computed_position = computed_position

    @property
    def new_block_ids(self):
        return self.new_block_ids_by_group[0]


class _RequestState:
    __slots__ = ("tokens", "block_ids")

    def __init__(self):
        self.tokens = []  # every token reported so far
        self.block_ids = None  # every block id reported so far, per group


class _Manager:
    """``build_scheduler_output(context, generation) -> (new_requests, cached_requests)``."""

    def __init__(self):
        self._requests = {}

    def build_scheduler_output(self, context_requests, generation_requests):
        new_requests, cached_requests = [], []
        for in_context, requests in ((True, context_requests), (False, generation_requests)):
            for request in requests:
                state = self._requests.get(request.request_id)
                is_new = state is None
                if is_new:
                    state = self._requests[request.request_id] = _RequestState()
                data = self._update_and_build_data(state, request, in_context)
                (new_requests if is_new else cached_requests).append(data)
        return new_requests, cached_requests

    def request_finished(self, request_id):
        self._requests.pop(request_id, None)

    @staticmethod
    def _new_block_ids(state, request):
        # The pattern kept by both versions: the whole block-id list of every group copied
        # (get_page_indices_by_layer_group / get_cache_indices return lists), then sliced.
        block_ids = [table.tolist() for table in request.block_tables]
        if state.block_ids is None:
            state.block_ids = [[] for _ in block_ids]
        new_block_ids = []
        for reported, ids in zip(state.block_ids, block_ids):
            new = ids[len(reported) :]
            reported.extend(new)
            new_block_ids.append(new)
        return new_block_ids


class BeforeSchedulerOutputManager(_Manager):
    """The "before" pattern (TensorRT-LLM before #22092): ``get_tokens(0)`` copies the
    whole token list of every scheduled request every iteration, and the new tokens are
    sliced from it; the whole block-id list is copied too. O(sequence length) per request."""

    def _update_and_build_data(self, state, request, in_context):
        new_block_ids = self._new_block_ids(state, request)
        tokens = request.get_tokens(0)  # the whole token list, as a new Python list
        new_tokens = tokens[len(state.tokens) :]
        state.tokens.extend(new_tokens)
        computed_position = request.context_current_position if in_context else len(tokens) - 1
        return BaselineRequestData(request.request_id, new_tokens, new_block_ids, computed_position)


class AfterSchedulerOutputManager(_Manager):
    """The "after" pattern (TensorRT-LLM #22092): a per-request Python loop that reads the length
    with ``get_num_tokens(0)`` and copies only the new tokens with ``get_tokens_range``; the
    whole block-id list is still copied per request per iteration (the cost #22092 left)."""

    def _update_and_build_data(self, state, request, in_context):
        new_block_ids = self._new_block_ids(state, request)
        num_tokens = request.get_num_tokens(0)
        new_tokens = request.get_tokens_range(0, len(state.tokens), num_tokens)
        state.tokens.extend(new_tokens)
        # "Generation computed_position uses the reported token count."
        computed_position = request.context_current_position if in_context else len(state.tokens) - 1
        return BaselineRequestData(request.request_id, new_tokens, new_block_ids, computed_position)
