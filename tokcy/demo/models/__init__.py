"""Real model architectures for the demo engine: Llama, Mistral and Qwen2 over tokcy's inputs.

``load_model(source)`` returns a model whose ``forward(inputs, kv_cache)`` consumes one
step's prepared inputs and the engine's paged KV cache, so it drops into
``Engine(model, EngineConfig(...))`` in every mode. ``source`` is a local checkpoint
directory (``config.json`` and ``*.safetensors``, sharded or not; read with
``safetensors``, memory-mapped, without importing ``transformers``) or a ``transformers``
causal-LM object. Modules: ``config`` (what the checkpoint's config says, checked),
``weights`` (where the tensors come from), ``attention`` (paged attention over the step's
metadata), ``llama`` (the forward), ``reference`` (``transformers``' own ``generate``, for
checking).
"""

import os

import torch

from tokcy.demo.models.config import SUPPORTED_MODEL_TYPES, ArchitectureConfig, UnsupportedModelError, parse_config
from tokcy.demo.models.llama import LlamaFamilyModel
from tokcy.demo.models.weights import CheckpointError, SafetensorsCheckpoint, StateDictSource, read_config

__all__ = ["SUPPORTED_MODEL_TYPES", "ArchitectureConfig", "CheckpointError", "LlamaFamilyModel",
           "UnsupportedModelError", "load_model", "parse_dtype"]

_DTYPES = {"float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16,
           "float32": torch.float32, "float": torch.float32, "float64": torch.float64, "double": torch.float64}


def parse_dtype(dtype):
    """A floating ``torch.dtype`` from a dtype or its name ("float16", "bfloat16", "float32", "float64")."""
    if isinstance(dtype, str):
        if dtype.removeprefix("torch.") not in _DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {', '.join(sorted(_DTYPES))}")
        return _DTYPES[dtype.removeprefix("torch.")]
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype or its name, not {dtype!r}")
    return dtype


def load_model(source, *, device="cpu", dtype=torch.float32):
    """A ``LlamaFamilyModel`` from a checkpoint directory or a ``transformers`` causal-LM object.

    Supported: ``model_type`` llama (grouped-query attention, Llama-3 ``rope_scaling``,
    tied or untied embeddings, attention and MLP biases), mistral (sliding-window
    attention) and qwen2 (q/k/v biases, sliding-window layers). Anything else, or any
    config option this loader does not implement, is an ``UnsupportedModelError`` naming
    it. Weights are cast to ``dtype`` on ``device``; from a model object already on that
    device in that dtype, tensors that need no fusing are shared with it, not copied.
    """
    dtype = parse_dtype(dtype)
    device = torch.device(device)
    if isinstance(source, (str, os.PathLike)):
        if not os.path.isdir(source):
            raise CheckpointError(f"{source}: not a directory (a checkpoint directory holds config.json and "
                                  "*.safetensors)")
        config = parse_config(read_config(source))
        tensors = SafetensorsCheckpoint(source)
    elif hasattr(source, "config") and hasattr(source, "state_dict"):
        config = parse_config(source.config.to_dict())
        tensors = StateDictSource(source)
        names = tensors.names()
        if "model.embed_tokens.weight" not in names and "embed_tokens.weight" in names:
            raise UnsupportedModelError(f"{type(source).__name__} is a base model without an LM head: pass the "
                                        "causal LM (for example LlamaForCausalLM)")
    else:
        raise TypeError(f"source must be a checkpoint directory or a transformers causal-LM model, "
                        f"not {type(source).__name__}")
    return LlamaFamilyModel(config, tensors, device=device, dtype=dtype)
