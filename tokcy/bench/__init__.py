"""``python -m tokcy bench``: tokcy against the patterns it replaces, timed on this machine.

Scenarios (one module each): ``accessors`` (the token buffer's accessors against
``get_tokens()`` slicing), ``memory`` (bytes per token against Python lists),
``executor`` (issue 3's batch: tokcy's ``prepare_inputs`` against the seeds' "before",
"after" and a numpy-vectorised baseline) and ``connector`` (seed 003's seven rows:
tokcy's scheduler output against "before" and "after", with the seed's own figures
beside them). The asv suite in ``asv_bench/`` times the same code.
"""
