"""``repr`` text shared by both backends, so the two print alike."""

_SHOWN = 4  # ids shown at each end of a long list


def format_ids(ids):
    """A short list text: every id up to 2 * _SHOWN, else both ends with an ellipsis."""
    if len(ids) <= 2 * _SHOWN:
        return "[" + ", ".join(map(str, ids)) + "]"
    head = ", ".join(map(str, ids[:_SHOWN]))
    tail = ", ".join(map(str, ids[-_SHOWN:]))
    return f"[{head}, ..., {tail}]"


def block_table_repr(name, ids, num_released):
    return f"{name}({format_ids(ids)}, num_released={num_released})"


def request_repr(name, request):
    counts = [request.get_num_tokens(beam) for beam in range(request.beam_width)]
    return (
        f"{name}(request_id={request.request_id}, state={request.state.name}, "
        f"prompt_len={request.prompt_len}, num_tokens={counts}, "
        f"context={request.context_current_position}+{request.context_chunk_size}, "
        f"draft_tokens={request.num_draft_tokens}, seq_slot={request.seq_slot})"
    )
