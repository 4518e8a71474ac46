"""What a Llama-family checkpoint's ``config.json`` says, checked: ``ArchitectureConfig``.

``parse_config`` reads the same mapping whether it comes from a checkpoint directory's
``config.json`` or from a ``transformers`` config object (``config.to_dict()``), in the
current layout (``rope_parameters``) or the older one (``rope_theta`` + ``rope_scaling``).
Every key must be one this loader understands: an option it does not implement (another
RoPE scaling, another activation, quantization, a key it has never seen) is an
``UnsupportedModelError`` that names it, because running such a checkpoint anyway would give
a model that looks fine and computes something else.
"""

import math
from dataclasses import dataclass

#: ``model_type`` values this loader implements.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")

_ROPE_TYPES = ("default", "llama3")
_ACTIVATIONS = ("silu", "swish")  # transformers maps both to SiLU

# Keys that describe the file, the tokenizer, training or generation, never the forward pass.
_HARMLESS_KEYS = frozenset(
    """_name_or_path architectures model_type transformers_version dtype torch_dtype id2label label2id
    problem_type return_dict output_attentions output_hidden_states chunk_size_feed_forward is_encoder_decoder
    is_decoder add_cross_attention cross_attention_hidden_size tie_encoder_decoder torchscript use_bfloat16
    tf_legacy_loss pruned_heads prefix finetuning_task task_specific_params tokenizer_class
    _attn_implementation_autoset use_cache initializer_range attention_dropout pretraining_tp
    max_position_embeddings bos_token_id eos_token_id pad_token_id sep_token_id decoder_start_token_id
    max_length min_length do_sample early_stopping num_beams num_beam_groups diversity_penalty temperature
    top_k top_p typical_p repetition_penalty length_penalty no_repeat_ngram_size encoder_no_repeat_ngram_size
    bad_words_ids num_return_sequences output_scores return_dict_in_generate forced_bos_token_id
    forced_eos_token_id remove_invalid_values exponential_decay_length_penalty suppress_tokens
    begin_suppress_tokens""".split()
)
_SHAPE_KEYS = frozenset(
    """vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads num_key_value_heads
    head_dim hidden_act rms_norm_eps rope_theta rope_scaling rope_parameters tie_word_embeddings""".split()
)
_FAMILY_KEYS = {
    "llama": frozenset({"attention_bias", "mlp_bias"}),
    "mistral": frozenset({"sliding_window"}),
    "qwen2": frozenset({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"}),
}
_ROPE_KEYS = {
    "default": frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"}),
    "llama3": frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor", "factor", "low_freq_factor",
                         "high_freq_factor", "original_max_position_embeddings"}),
}


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture or one of its config options is not implemented here."""


@dataclass(frozen=True)
class Llama3RopeScaling:
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ArchitectureConfig:
    """The shape of a Llama-family model, as the engine and the forward need it.

    ``num_layers``, ``num_kv_heads`` and ``head_dim`` size the KV cache.
    ``sliding_windows`` has one entry per layer: the number of positions a query sees
    (itself included), or None for full attention.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: Llama3RopeScaling | None
    tie_word_embeddings: bool
    qkv_bias: bool
    o_proj_bias: bool
    mlp_bias: bool
    sliding_windows: tuple

    @property
    def sliding_window(self):
        """The window every layer shares, or None when some layer attends to everything.

        Only then may the blocks that fell out of the window be released: a full-attention
        layer still reads them.
        """
        windows = set(self.sliding_windows)
        return windows.pop() if len(windows) == 1 else None


def _refuse(model_type, what):
    raise UnsupportedModelError(f"{model_type} checkpoint: {what} is not supported by tokcy.demo.load_model")


def _positive_int(mapping, key, model_type):
    value = mapping.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        _refuse(model_type, f"{key}={value!r} (a positive integer is required)")
    return value


def _flag(mapping, key, model_type, default=False):
    value = mapping.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        _refuse(model_type, f"{key}={value!r} (true or false is required)")
    return value


def _rope(mapping, model_type, head_dim):
    """(rope_theta, Llama3RopeScaling or None) from either config layout."""
    where = "rope_parameters" if mapping.get("rope_parameters") else "rope_scaling"
    params = mapping.get(where) or {}
    if not isinstance(params, dict):
        _refuse(model_type, f"{where}={params!r}")
    if any(isinstance(value, dict) for value in params.values()):
        _refuse(model_type, f"{where} given per layer type ({sorted(params)})")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _ROPE_TYPES:
        _refuse(model_type, f"{where} of type {rope_type!r} (supported: {', '.join(_ROPE_TYPES)})")
    unknown = sorted(set(params) - _ROPE_KEYS[rope_type])
    if unknown:
        _refuse(model_type, f"{where} option {unknown[0]!r} for RoPE type {rope_type!r}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        _refuse(model_type, f"{where} partial_rotary_factor={params['partial_rotary_factor']!r}")
    theta = params.get("rope_theta", mapping.get("rope_theta", 10000.0))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 1:
        _refuse(model_type, f"rope_theta={theta!r}")
    if head_dim % 2:
        _refuse(model_type, f"head_dim={head_dim} (rotary embedding needs an even head_dim)")
    if rope_type == "default":
        return float(theta), None
    missing = [key for key in ("factor", "low_freq_factor", "high_freq_factor") if key not in params]
    if missing:
        _refuse(model_type, f"{where} of type 'llama3' without {missing[0]!r}")
    scaling = Llama3RopeScaling(
        float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"]),
        int(params.get("original_max_position_embeddings", mapping.get("max_position_embeddings", 0))),
    )
    if scaling.original_max_position_embeddings < 1 or not scaling.high_freq_factor > scaling.low_freq_factor:
        _refuse(model_type, f"{where} {params!r} (llama3 needs original_max_position_embeddings >= 1 and "
                            "high_freq_factor > low_freq_factor)")
    return float(theta), scaling


def _sliding_windows(mapping, model_type, num_layers):
    if model_type == "llama":
        return (None,) * num_layers
    if model_type == "mistral":
        window = mapping.get("sliding_window")
        if window is not None:
            window = _positive_int(mapping, "sliding_window", model_type)
        return (window,) * num_layers
    # qwen2: the window only counts when use_sliding_window is set, then per layer_types
    # (by default, the layers from max_window_layers on), as in transformers' Qwen2Config
    use = _flag(mapping, "use_sliding_window", model_type)
    window = _positive_int(mapping, "sliding_window", model_type) if use else None
    layer_types = mapping.get("layer_types")
    if layer_types is None:
        first = mapping.get("max_window_layers", 28)
        layer_types = ["sliding_attention" if window is not None and i >= first else "full_attention"
                       for i in range(num_layers)]
    if not isinstance(layer_types, (list, tuple)) or len(layer_types) != num_layers:
        _refuse(model_type, f"layer_types={layer_types!r} (one entry per layer is required)")
    windows = []
    for kind in layer_types:
        if kind == "full_attention":
            windows.append(None)
        elif kind == "sliding_attention" and window is not None:
            windows.append(window)
        else:
            _refuse(model_type, f"layer_types entry {kind!r}" + (" without use_sliding_window" * (window is None)))
    return tuple(windows)


def parse_config(mapping):
    """``ArchitectureConfig`` from a ``config.json`` mapping; ``UnsupportedModelError`` names what is not."""
    if not isinstance(mapping, dict):
        raise TypeError(f"a config mapping is required, not {type(mapping).__name__}")
    model_type = mapping.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported by tokcy.demo.load_model "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    known = _HARMLESS_KEYS | _SHAPE_KEYS | _FAMILY_KEYS[model_type]
    if "quantization_config" in mapping:
        _refuse(model_type, "quantization_config (quantized weights)")
    unknown = sorted(key for key in mapping if key not in known)
    if unknown:
        _refuse(model_type, f"config option {unknown[0]!r} (not implemented; it may change the architecture)")
    activation = mapping.get("hidden_act", "silu")
    if activation not in _ACTIVATIONS:
        _refuse(model_type, f"hidden_act={activation!r} (supported: silu)")

    hidden = _positive_int(mapping, "hidden_size", model_type)
    heads = _positive_int(mapping, "num_attention_heads", model_type)
    kv_heads = mapping.get("num_key_value_heads") or heads
    kv_heads = _positive_int({"num_key_value_heads": kv_heads}, "num_key_value_heads", model_type)
    if heads % kv_heads:
        _refuse(model_type, f"num_attention_heads={heads} with num_key_value_heads={kv_heads} (must divide)")
    head_dim = mapping.get("head_dim") or hidden // heads
    head_dim = _positive_int({"head_dim": head_dim}, "head_dim", model_type)
    num_layers = _positive_int(mapping, "num_hidden_layers", model_type)
    eps = mapping.get("rms_norm_eps", 1e-6)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (eps >= 0 and math.isfinite(eps)):
        _refuse(model_type, f"rms_norm_eps={eps!r}")
    theta, scaling = _rope(mapping, model_type, head_dim)

    attention_bias = model_type == "qwen2" or _flag(mapping, "attention_bias", model_type)
    return ArchitectureConfig(
        model_type=model_type,
        vocab_size=_positive_int(mapping, "vocab_size", model_type),
        hidden_size=hidden,
        intermediate_size=_positive_int(mapping, "intermediate_size", model_type),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(eps),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=_flag(mapping, "tie_word_embeddings", model_type),
        qkv_bias=attention_bias,
        o_proj_bias=model_type == "llama" and attention_bias,  # Qwen2: q/k/v only
        mlp_bias=_flag(mapping, "mlp_bias", model_type),
        sliding_windows=_sliding_windows(mapping, model_type, num_layers),
    )
