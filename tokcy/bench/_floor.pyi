# Types of the optional C helper tokcy/bench/_floor.c (built with the package when a compiler is present).

def prepare(
    num_generation: int, seq_len: int, num_drafts: int, chunk: int, reps: int, rounds: int, /
) -> tuple[list[float], int]: ...
def report(
    num_requests: int, num_tokens: int, block_size: int, reps: int, rounds: int, /
) -> tuple[list[float], int]: ...
