"""Run by ``test_published`` under a Python that has speculators: load an exported head with
``SpeculatorModel.from_pretrained`` and print, as one JSON line, what speculators made of it."""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from speculators import SpeculatorModel

folder = Path(sys.argv[1])
model = SpeculatorModel.from_pretrained(str(folder))
state, saved = model.state_dict(), load_file(str(folder / "model.safetensors"))
print(json.dumps({
    "class": type(model).__name__,
    "missing": sorted(set(state) - set(saved)),
    "unexpected": sorted(set(saved) - set(state)),
    "equal": all(torch.equal(state[k].to(v.dtype), v) for k, v in saved.items() if k in state),
    "verifier": model.config.speculators_config.verifier.name_or_path,
    "taps": model.config.eagle_aux_hidden_state_layer_ids,
    "rope_theta": model.config.transformer_layer_config.rope_parameters["rope_theta"],
}))
