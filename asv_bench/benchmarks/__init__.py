"""airspeed velocity benchmarks for tokcy (see docs/benchmarks.md).

Every benchmark is parametrised by backend: ``cython`` (the compiled ``tokcy._core``) and
``python`` (the pure twin ``tokcy._pure``), chosen inside the benchmark from the modules,
never from ``TOKCY_PURE_PYTHON``. The baselines come from ``tokcy._baselines`` (the
patterns TensorRT-LLM pull requests #16791 and #22092 replaced) and are checked equal to
tokcy's output once per configuration
before anything is timed.
"""
