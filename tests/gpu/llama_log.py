"""What llama.cpp itself says it did, read from its log (`edgespec --verbose`): per loaded model, the
layer -> device assignment, the offloaded layer count, and the buffer sizes per device.

Used by the GPU suite (checked against edgespec's plan) and by scripts/device-cuda-check.
Lines as printed by the llama.cpp vendored in llama-cpp-python 0.3.36, e.g.
    load_tensors: layer  29 assigned to device Vulkan0, is_swa = 0
    load_tensors: offloaded 14/31 layers to GPU
    load_tensors:      Vulkan0 model buffer size =    36.26 MiB
    llama_kv_cache:    Vulkan0 KV buffer size =    22.50 MiB
    llama_context:     Vulkan0 compute buffer size =   97.00 MiB
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

MiB = 1024 * 1024

_MODEL_START = re.compile(r"llama_model_loader: loaded meta data with")
_LAYER = re.compile(r"load_tensors: layer\s+(\d+) assigned to device (\S+?),")
_OFFLOADED = re.compile(r"load_tensors: offloaded (\d+)/(\d+) layers to GPU")
_BUFFER = re.compile(r"(\S+) (model|KV|compute) buffer size =\s+([0-9.]+) MiB")


@dataclass
class LoadedModel:
    offloaded: int = -1  # llama.cpp's "offloaded K/N layers to GPU"
    n_units: int = -1
    layers: dict[int, str] = field(default_factory=dict)  # layer index -> device name (n_layers = output)
    model: dict[str, int] = field(default_factory=dict)  # device/buffer type -> bytes
    kv: dict[str, int] = field(default_factory=dict)
    compute: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)

    def on(self, device: str) -> int:
        """Bytes llama.cpp allocated on `device` for this model: weights + KV + compute."""
        return self.model.get(device, 0) + self.kv.get(device, 0) + self.compute.get(device, 0)


def parse_llama_log(text: str) -> list[LoadedModel]:
    """One LoadedModel per model load, in load order (edgespec loads the target, then the draft)."""
    loaded: list[LoadedModel] = []
    for line in text.splitlines():
        if _MODEL_START.search(line):
            loaded.append(LoadedModel())
            continue
        if not loaded:
            continue
        cur = loaded[-1]
        if m := _LAYER.search(line):
            cur.layers[int(m.group(1))] = m.group(2)
        elif m := _OFFLOADED.search(line):
            cur.offloaded, cur.n_units = int(m.group(1)), int(m.group(2))
        elif m := _BUFFER.search(line):
            where = {"model": cur.model, "KV": cur.kv, "compute": cur.compute}[m.group(2)]
            where[m.group(1)] = where.get(m.group(1), 0) + round(float(m.group(3)) * MiB)
    return loaded
