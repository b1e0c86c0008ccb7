"""The continuous-batching engine: `from engine import LLM, SamplingParams`."""

from engine.config import EngineConfig
from engine.llm import LLM
from engine.llm_engine import LLMEngine, PromptTooLongError
from engine.loader import ModelNotFoundError
from engine.outputs import CompletionOutput, Increment, RequestOutput, TokenLogprob
from engine.sampling_params import SamplingParams
from engine.sequence import BATCH, INTERACTIVE

__all__ = [
    "BATCH",
    "INTERACTIVE",
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "Increment",
    "LLMEngine",
    "ModelNotFoundError",
    "PromptTooLongError",
    "RequestOutput",
    "SamplingParams",
    "TokenLogprob",
]
