"""Where a checkpoint's tensors come from: a safetensors directory or a ``transformers`` model object.

A directory in the standard layout holds ``config.json`` and either one
``model.safetensors`` or shards listed by ``model.safetensors.index.json``
(``{"weight_map": {tensor name: shard file}}``). Shards are opened with
``safetensors.safe_open``, which memory-maps the file: a tensor is read when it is asked
for, one at a time, so loading never holds the whole checkpoint twice. Nothing here
imports ``transformers``.

Both sources answer the same two questions, the names they hold and one tensor by name,
so the model is built by one function whichever was given.
"""

import json
from pathlib import Path

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """The directory is not a readable checkpoint: a file is missing or malformed."""


def read_config(directory):
    """The ``config.json`` mapping of a checkpoint directory."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{directory}: no {CONFIG_FILE} (a checkpoint directory holds config.json and "
                              "*.safetensors)")
    try:
        mapping = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(mapping, dict):
        raise CheckpointError(f"{path}: a JSON object is required")
    return mapping


class SafetensorsCheckpoint:
    """The tensors of a checkpoint directory, read on demand from its memory-mapped shards."""

    def __init__(self, directory):
        try:
            from safetensors import safe_open
        except ImportError:
            raise ImportError("loading a checkpoint directory needs safetensors: pip install 'tokcy[models]'") from None
        self.directory = directory = Path(directory)
        index_path = directory / INDEX_FILE
        if index_path.is_file():
            try:
                weight_map = json.loads(index_path.read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as error:
                raise CheckpointError(f"{index_path}: no readable weight_map ({error!r})") from None
            if not isinstance(weight_map, dict):
                raise CheckpointError(f"{index_path}: weight_map must be an object")
            shard_names = sorted(set(weight_map.values()))
        elif (directory / SINGLE_FILE).is_file():
            weight_map, shard_names = None, [SINGLE_FILE]
        else:
            raise CheckpointError(f"{directory}: neither {SINGLE_FILE} nor {INDEX_FILE}")
        self._shards = {}
        for name in shard_names:
            path = directory / name
            if not path.is_file():
                raise CheckpointError(f"{directory}: shard {name} listed in {INDEX_FILE} is missing")
            self._shards[name] = safe_open(str(path), framework="pt", device="cpu")
        if weight_map is None:
            weight_map = {tensor: SINGLE_FILE for tensor in self._shards[SINGLE_FILE].keys()}
        else:
            for tensor, shard in weight_map.items():
                if tensor not in self._shards[shard].keys():
                    raise CheckpointError(f"{directory}: {INDEX_FILE} puts {tensor} in {shard}, which lacks it")
        self._where = weight_map

    def names(self):
        return set(self._where)

    def get(self, name):
        return self._shards[self._where[name]].get_tensor(name)


class StateDictSource:
    """The tensors of a ``torch.nn.Module`` (a ``transformers`` causal LM), by state-dict name."""

    def __init__(self, module):
        self._tensors = module.state_dict()

    def names(self):
        return set(self._tensors)

    def get(self, name):
        return self._tensors[name].detach()
