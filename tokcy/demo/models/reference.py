"""The independent reference: ``transformers``' own implementation, generating greedily.

The same weights run through ``transformers``' modelling code, one request at a time, with
``generate(..., do_sample=False)``: nothing of tokcy, the demo engine or its forward is
involved. The model's own generation defaults (a checkpoint's ``generation_config.json``
may set a repetition penalty, an end-of-sequence token, ...) are set aside for the call, so
the reference produces exactly ``max_new_tokens`` plain greedy tokens, as the engine does.
"""

import contextlib
import copy
import os

import torch


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError("the reference needs transformers: pip install 'tokcy[models]'") from None
    return transformers


def reference_model(source, *, device="cpu", dtype=torch.float32):
    """A ``transformers`` causal LM with ``source``'s weights on ``device`` in ``dtype``, in eval mode.

    ``source``: a checkpoint directory (loaded with ``AutoModelForCausalLM``) or a model
    object (returned as is when it already has that device and dtype, else a converted copy).
    """
    transformers = _transformers()
    if isinstance(source, (str, os.PathLike)):
        transformers.utils.logging.disable_progress_bar()
        model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    else:
        model = source
        if model.dtype != dtype or model.device != torch.device(device):
            model = copy.deepcopy(model)
    return model.to(device=device, dtype=dtype).eval()


@contextlib.contextmanager
def _plain_generation_defaults(model):
    transformers = _transformers()
    saved = model.generation_config
    model.generation_config = transformers.GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


def generate(model, prompt, max_new_tokens):
    """``max_new_tokens`` greedy token ids after ``prompt`` (token ids), by ``model.generate``."""
    ids = torch.tensor([[int(t) for t in prompt]], dtype=torch.long, device=model.device)
    with torch.inference_mode(), _plain_generation_defaults(model):
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False)
    return out[0, ids.shape[1]:].tolist()
