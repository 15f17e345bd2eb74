"""Moving weights between the notebook modules (Python) and torchattn (C++).

Python -> C++:  torchattn_interop.save(module, "w.pt")  # torch.save(dict(module.state_dict()), ...)
                then in C++: torchattn::load_state_dict(*module, "w.pt")
C++ -> Python:  torchattn::save_state_dict(*module, "w.pt") in C++,
                then module.load_state_dict(torchattn_interop.load("w.pt"))

LibTorch's pickler tags its dicts with torch.jit._pickle.restore_type_tag, a torch
function that torch.load's default weights_only=True mode does not know; `load`
allows exactly that one and nothing else.
"""

import torch
import torch.jit._pickle  # noqa: F401  (the module holding restore_type_tag)


def load(path):
    """Reads a state dict written by torchattn::save_state_dict (weights only)."""
    with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]):
        return torch.load(path, weights_only=True)


def save(module, path):
    """Writes module.state_dict() as a plain dict, which torchattn::load_state_dict reads.

    LibTorch's unpickler cannot read the OrderedDict (with its _metadata) that
    state_dict() returns; the same tensors in a plain dict read fine.
    """
    torch.save(dict(module.state_dict()), path)
