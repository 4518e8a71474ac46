# Types of the optional C helper tokcy/bench/_floor*.c (built with the package when a compiler is present).

def prepare(
    num_generation: int, seq_len: int, num_drafts: int, chunk: int, reps: int, rounds: int, /
) -> tuple[list[float], int]: ...
def report(
    num_requests: int, num_tokens: int, block_size: int, reps: int, rounds: int, /
) -> tuple[list[float], int]: ...
def attention(
    num_requests: int, seq_len: int, block_size: int, num_groups: int, every: int, reps: int, rounds: int, /
) -> tuple[list[float], int]: ...
def attention_buffer(
    num_requests: int, seq_len: int, block_size: int, num_groups: int, every: int, steps: int, /
) -> bytes: ...
