"""tokcy.demo: a small continuous-batching engine built on tokcy, checked against a plain reference.

``python -m tokcy demo --help``. Modules, one job each: ``model`` (tiny transformer over a
paged KV cache), ``kv_cache`` (block pool and storage), ``scheduler`` (token budget,
chunked prefill, preemption), ``speculation`` (prompt-lookup drafts), ``connector`` (the
offload-store mirror), ``reference`` (full-recompute greedy generation), ``workload``
(prompts), ``engine`` (which compares its inputs with the seed's "after" input preparation,
``tokcy._baselines.executor.after``), ``cli``.
"""
