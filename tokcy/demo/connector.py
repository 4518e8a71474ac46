"""An "offload store": the consumer side of ``tokcy.connector``.

It applies every ``SchedulerOutput`` in order and keeps, per request, a mirror of the
tokens and block ids (per layer group) that the reports describe. A new request's mirror
is its report; a cached request's report drops ``num_replaced_*`` entries from the end,
appends the new ones, and marks the first ``num_released_*`` blocks -1. ``check`` compares
a mirror with the request's real state: the connector's invariant (nothing lost, nothing
duplicated, rewinds included; docs/connector.md).
"""


class MirrorMismatch(AssertionError):
    pass


def _ints(values):
    return [int(v) for v in values]


class OffloadStore:
    def __init__(self):
        self.tokens = {}
        self.blocks = {}
        self.reports = 0
        self.tokens_received = 0
        self.blocks_received = 0

    def apply(self, scheduler_output):
        """Consume one iteration's report; returns (tokens, block ids) received."""
        tokens_before, blocks_before = self.tokens_received, self.blocks_received
        for data in scheduler_output.new_requests:
            new_tokens = _ints(data.new_tokens)
            groups = [_ints(group) for group in data.new_block_ids_by_group]
            self.tokens[data.request_id] = new_tokens
            self.blocks[data.request_id] = groups
            self.tokens_received += len(new_tokens)
            self.blocks_received += sum(len(group) for group in groups)
        for data in scheduler_output.cached_requests:
            request_id = data.request_id
            if request_id not in self.tokens:
                raise MirrorMismatch(f"cached report for request {request_id}, which the store never saw as new")
            tokens = self.tokens[request_id]
            replaced = int(data.num_replaced_tokens)
            if replaced > len(tokens):
                raise MirrorMismatch(f"request {request_id}: replaces {replaced} of {len(tokens)} tokens")
            del tokens[len(tokens) - replaced :]
            new_tokens = _ints(data.new_tokens)
            tokens.extend(new_tokens)
            self.tokens_received += len(new_tokens)
            groups = self.blocks[request_id]
            for group, (new_ids, replaced, released) in enumerate(
                zip(data.new_block_ids_by_group, data.num_replaced_blocks_by_group, data.num_released_blocks_by_group)
            ):
                ids = groups[group]
                replaced, released = int(replaced), int(released)
                if replaced > len(ids):
                    raise MirrorMismatch(f"request {request_id}: replaces {replaced} of {len(ids)} blocks")
                del ids[len(ids) - replaced :]
                new_ids = _ints(new_ids)
                ids.extend(new_ids)
                self.blocks_received += len(new_ids)
                for position in range(min(released, len(ids))):
                    ids[position] = -1
        self.reports += 1
        return self.tokens_received - tokens_before, self.blocks_received - blocks_before

    def finished(self, request_id):
        self.tokens.pop(request_id, None)
        self.blocks.pop(request_id, None)

    def check(self, request):
        """Raise ``MirrorMismatch`` unless the mirror equals ``request``'s tokens and blocks."""
        request_id = request.request_id
        if request_id not in self.tokens:
            raise MirrorMismatch(f"request {request_id} was never reported")
        real_tokens = request.get_tokens(0)
        if self.tokens[request_id] != real_tokens:
            mirror = self.tokens[request_id]
            first = next((i for i, (a, b) in enumerate(zip(mirror, real_tokens)) if a != b), min(len(mirror), len(real_tokens)))
            raise MirrorMismatch(
                f"request {request_id}: mirror has {len(mirror)} tokens, request {len(real_tokens)}; first difference at {first}"
            )
        real_blocks = [table.tolist() for table in request.block_tables]
        if self.blocks[request_id] != real_blocks:
            raise MirrorMismatch(f"request {request_id}: mirror blocks {self.blocks[request_id]} != real {real_blocks}")
