"""Deliberate type mistakes: mypy must report each line marked ``# E:`` (and nothing else).

CI runs mypy on this file and checks the report line for line (.ci/typecheck).
"""

import tokcy
from tokcy.connector import SchedulerOutputManager
from tokcy.executor import HostBuffers, prepare_inputs

request = tokcy.Request(1, [5, 6, 7])
request.get_tokens_range(0, "1", 3)  # E: arg-type
count: str = request.get_num_tokens(0)  # E: assignment
tokcy.Request(2, [1], 4)  # E: call-arg  (beam_width is keyword-only)
prepare_inputs([request], [request], max_draft_len=None)  # E: arg-type
SchedulerOutputManager().build_scheduler_output([request], [1])  # E: list-item
HostBuffers(64, 8).input_idz  # E: attr-defined  (its arrays are named attributes)
HostBuffers(64, 8).metadata = None  # E: misc  (a holder's fields are read-only)
