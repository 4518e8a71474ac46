"""tokcy.demo: a small continuous-batching engine built on tokcy, checked against a plain reference.

``python -m tokcy demo --help``. Modules, one job each: ``model`` (tiny transformer over a
paged KV cache), ``kv_cache`` (block pool and storage), ``scheduler`` (token budget,
chunked prefill, preemption), ``speculation`` (prompt-lookup drafts), ``connector`` (the
offload-store mirror), ``reference`` (full-recompute greedy generation), ``workload``
(prompts), ``engine`` (which compares its inputs with TensorRT-LLM's input
preparation as fixed by the pull request #16791, transcribed,
``tokcy._baselines.executor.after``), ``cli``; ``models`` (real architectures:
``tokcy.demo.load_model`` runs Llama, Mistral and Qwen2 checkpoints in the same engine,
checked against ``transformers``' own ``generate``).
"""


def __getattr__(name):
    # ``load_model`` lives with the model families; imported on first use, so that
    # ``import tokcy.demo`` stays light (no torch)
    if name == "load_model":
        from tokcy.demo.models import load_model

        return load_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
