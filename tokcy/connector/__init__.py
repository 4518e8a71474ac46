"""The KV-cache connector's scheduler output: what is new since the last report, per request.

Each iteration, ``SchedulerOutputManager.build_scheduler_output(context_requests,
generation_requests, device_token_requests=())`` reports, for every scheduled request, the beam-0 tokens and the
KV block ids (per layer group) not yet reported, the computed position and the number of
scheduled tokens, as a columnar ``SchedulerOutput`` (flat numpy arrays plus offsets);
``RequestData`` objects are built only when ``new_requests`` / ``cached_requests`` are
read. Cost: O(batch + new tokens + new blocks), flat in sequence length.

A consumer keeps a mirror per request: for a new request the mirror is the report; for a
cached one it drops ``num_replaced_tokens`` tokens (``num_replaced_blocks_by_group[g]``
blocks) from the end, appends ``new_tokens`` (``new_block_ids_by_group[g]``) and sets the
first ``num_released_blocks_by_group[g]`` block ids to -1. The mirror then always equals
the request's real tokens and block tables (docs/connector.md states the rules).
"""

from tokcy.connector.manager import SchedulerOutputManager
from tokcy.connector.output import RequestData, SchedulerOutput

__all__ = ["RequestData", "SchedulerOutput", "SchedulerOutputManager"]
