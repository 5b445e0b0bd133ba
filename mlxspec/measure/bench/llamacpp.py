"""llama.cpp as ``bench``'s CPU peer: the very GGUF file our target was read from, decoded by
llama.cpp's own plain (target-only) decoding through llama-cpp-python, interleaved prompt by
prompt with our methods in the same rounds.

It decodes the prompt ids our tokenizer made (the GGUF's chat template, as every method
gets them), after checking that llama.cpp's vocabulary spells those ids as ours does; counts
and stops as our engine does (end-of-sequence not counted, at most ``max_tokens``); runs at
the same temperature and filters, with as many threads as our target uses; and prefills the
whole prompt every run (its cache is reset, so no run reuses another's prefix). Install:
``pip install 'mlxspec[llama]'`` builds llama-cpp-python from source (README, "Against llama.cpp")."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mlxspec.core.runs import Run
from mlxspec.core.sampling import SamplingParams
from mlxspec.errors import MlxspecError
from mlxspec.measure.runs import timed_tokens

INSTALL_HINT = ("install the llama extra: CMAKE_ARGS=\"-DGGML_NATIVE=ON\" pip install 'mlxspec[llama]' "
                "(a source build of llama-cpp-python, 10-20 minutes on 2 cores)")
CONTEXT = 4096  # llama.cpp's KV cache: the longest prompt plus reply a bench run asks for


@dataclass(frozen=True)
class LlamaCpp:
    """An open llama.cpp model (``llm``: a ``llama_cpp.Llama`` or a stand-in with its methods)."""

    llm: Any
    path: str
    threads: int
    description: str


def open_llama_cpp(lm: Any, threads: int, llama_class: Any = None) -> LlamaCpp:
    """llama.cpp on ``lm``'s own GGUF file with ``threads`` threads; an error line where the
    target is not a GGUF file or llama-cpp-python is missing."""
    path = str(getattr(lm, "path", ""))
    if not path.endswith(".gguf"):
        raise MlxspecError(f"--llama-cpp runs llama.cpp on the target's GGUF file; {lm.name} was read from {path or 'no file'}")
    if llama_class is None:
        try:
            import llama_cpp
        except ImportError:
            raise MlxspecError(f"--llama-cpp needs llama-cpp-python: {INSTALL_HINT}") from None
        llama_class, version = llama_cpp.Llama, llama_cpp.__version__
    else:
        version = getattr(llama_class, "version", "a stand-in")
    llm = llama_class(model_path=path, n_ctx=CONTEXT, n_threads=threads, n_threads_batch=threads, verbose=False)
    return LlamaCpp(llm, path, threads, f"llama.cpp plain decoding (llama-cpp-python {version}, {threads} threads)")


def threads_of(lm: Any) -> int:
    """The threads our target decodes with: torch's on the torch path, else every core (MLX's
    CPU backend and its BLAS use them all)."""
    if str(getattr(lm, "backend", "mlx")).startswith("torch"):
        import torch

        return torch.get_num_threads()
    return os.cpu_count() or 1


def check_same_tokens(peer: LlamaCpp, tokenizer: Any, prompts: Sequence[list[int]]) -> None:
    """Refuse to compare unless llama.cpp spells every prompt's ids as our tokenizer does (the
    same ids then mean the same text to both)."""
    for i, ids in enumerate(prompts):
        ours = tokenizer.decode(ids, skip_special_tokens=False) if _takes_skip(tokenizer) else tokenizer.decode(ids)
        theirs = peer.llm.detokenize(ids, special=True).decode("utf-8", "replace")
        if ours != theirs:
            raise MlxspecError(f"llama.cpp reads prompt {i + 1}'s token ids as other text than our tokenizer does "
                               f"({theirs[:40]!r} vs {ours[:40]!r}): the two would not decode the same prompt")


def _takes_skip(tokenizer: Any) -> bool:
    import inspect

    try:
        return "skip_special_tokens" in inspect.signature(tokenizer.decode).parameters
    except (TypeError, ValueError):
        return False


def llama_cpp_run(peer: LlamaCpp, ids: list[int], params: SamplingParams, max_tokens: int, stop: set[int],
                  seed: int) -> Run:
    """One reply by llama.cpp, timed from outside as ``timed_tokens`` times a generator:
    prefill ends at the first token. Its cache is reset first, so the whole prompt is prefilled."""
    if params.processes:
        raise MlxspecError("llama.cpp's penalties look back another window than ours: the peer runs without them")
    llm = peer.llm
    llm.reset()
    llm.set_seed(seed)
    # every llama.cpp default that filters is set to ours (its own defaults are top-k 40, top-p
    # 0.95, min-p 0.05 and T 0.8); top-k 0 is off in both
    tokens = llm.generate(ids, temp=params.temperature, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p,
                          typical_p=1.0, repeat_penalty=1.0, reset=True)
    return timed_tokens(tokens, len(ids), stop, max_tokens)
