"""``python -m tokcy bench``: tokcy against the patterns it replaces, timed on this machine.

Scenarios (one module each): ``accessors`` (the token buffer's accessors against
``get_tokens()`` slicing), ``memory`` (bytes per token against Python lists),
``executor`` (tokcy's ``prepare_inputs`` against the "before" and "after" code of
TensorRT-LLM pull request #16791 and a numpy-vectorised baseline), ``connector`` (the
seven rows of pull request #22092: tokcy's scheduler output against "before" and
"after", with the pull request's own figures in a section of their own), and
``executor_batch`` / ``connector_batch`` (the same loops from 1 to 4,096 requests).
Every executor and connector row has a ``floor`` column: the same work as plain C,
timed in C (``tokcy.bench.floor``). The asv suite in ``asv_bench/`` times the same code.
"""
