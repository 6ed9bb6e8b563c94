"""vLLM worker extension: checkpoint files on the pod's disk --> the running model's weights, in place.

vLLM instantiates this mix-in inside each GPU worker (engine argument `worker_extension_cls`), and the
engine reaches it with `collective_rpc("apprentice_load_weights", args=(path,))`. `load_weights` takes
Hugging Face parameter names and handles vLLM's fused layouts (qkv, gate_up). Imported only by vLLM.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class WeightReloader:
    model_runner: Any  # provided by the vLLM worker this class is mixed into

    def apprentice_load_weights(self, path: str) -> int:
        """Load every `*.safetensors` under `path` into the model; returns the number of tensors."""
        import torch
        from safetensors import safe_open

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors under {path}")
        count = 0

        def tensors():  # noqa: ANN202 - generator of (name, tensor)
            nonlocal count
            for f in files:
                with safe_open(str(f), framework="pt", device="cpu") as st:
                    for name in st.keys():  # noqa: SIM118 - safe_open has no __iter__
                        count += 1
                        yield name, st.get_tensor(name)

        self.model_runner.model.load_weights(weights=tensors())
        torch.cuda.synchronize()
        return count
