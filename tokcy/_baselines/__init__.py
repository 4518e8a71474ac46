"""Baselines for the benchmarks: what an engine runs without tokcy, written from the
TensorRT-LLM pull requests #16791 and #22092.

Each module reproduces the patterns of one benchmark, each function with a comment naming
the pattern it reproduces. Every baseline's output is checked equal to tokcy's once per
benchmark setup, so no benchmark times a wrong answer. Not part of the public API.
"""
