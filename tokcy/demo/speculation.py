"""Speculative decoding by prompt lookup: n-gram drafts from the request's own history.

``NgramIndex`` keeps, for every n in ``min_ngram .. max_ngram``, where each n-gram of the
history was last followed by a token. It is updated as tokens are appended (O(n-gram
sizes) per token), so a lookup costs O(max_ngram + draft length) at any context length:
the host work per step stays flat, the point of the whole library.

``propose`` matches the longest suffix n-gram seen earlier and drafts the tokens that
followed it (read with ``get_tokens_range``). ``accept`` is the greedy verification rule:
the longest prefix of the drafts that agrees with the model's own predictions, plus one
bonus token (the model's prediction after that prefix).
"""


class NgramIndex:
    def __init__(self, *, min_ngram=1, max_ngram=3):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self._follower = {}  # (n-gram tuple) -> position of the token that last followed it
        self._tail = []  # the last max_ngram tokens
        self._length = 0

    def __len__(self):
        return self._length

    def extend(self, tokens):
        """Record tokens appended to the history (in order)."""
        tail, follower = self._tail, self._follower
        for token in tokens:
            token = int(token)
            position = self._length
            for n in range(self.min_ngram, min(self.max_ngram, len(tail)) + 1):
                follower[tuple(tail[-n:])] = position
            tail.append(token)
            if len(tail) > self.max_ngram:
                del tail[0]
            self._length += 1

    def lookup(self, max_len):
        """Position and length of the draft after the longest suffix n-gram seen before, or None."""
        if max_len <= 0:
            return None
        tail = self._tail
        for n in range(min(self.max_ngram, len(tail)), self.min_ngram - 1, -1):
            position = self._follower.get(tuple(tail[-n:]))
            if position is not None:
                return position, min(max_len, self._length - position)
        return None


def propose(request, index, max_len):
    """Draft tokens (a list, possibly empty) for ``request`` whose history ``index`` mirrors."""
    if len(index) != request.get_num_tokens(0):
        raise RuntimeError(
            f"request {request.request_id}: n-gram index has {len(index)} tokens, request {request.get_num_tokens(0)}"
        )
    found = index.lookup(max_len)
    if found is None:
        return []
    position, length = found
    return request.get_tokens_range(0, position, position + length)


def accept(drafts, predictions):
    """Tokens to append: the longest prefix of ``drafts`` equal to ``predictions`` plus the bonus.

    ``predictions[i]`` is the model's greedy token after the last token and ``drafts[:i]``;
    there are ``len(drafts) + 1`` of them. Returns (tokens, number of drafts accepted).
    """
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == predictions[accepted]:
        accepted += 1
    return list(drafts[:accepted]) + [predictions[accepted]], accepted
