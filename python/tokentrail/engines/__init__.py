"""Inference engines behind the adapter: SGLang, vLLM, a Hugging Face model in process, and a
scripted one for tests.

All speak token ids (`GenerateRequest` in, `Generation` out); `create_engine("sglang://h:p")`,
`create_engine("vllm://h:p")` or `create_engine("scripted")` picks one from the registry;
importing the engine modules here registers them.
"""

from __future__ import annotations

from tokentrail.engines.base import (
    Engine,
    GenerateRequest,
    Generation,
    ReplayRequest,
    SamplingParams,
)
from tokentrail.engines.registry import create_engine, engine_names, register_engine
from tokentrail.engines.scripted import ScriptedEngine
from tokentrail.engines.sglang import SGLangEngine
from tokentrail.engines.transformers_lm import TransformersEngine
from tokentrail.engines.vllm import VLLMEngine
from tokentrail.errors import EngineError, EngineSpecError, SamplingParamsError, ScriptError

__all__ = [
    "Engine",
    "EngineError",
    "EngineSpecError",
    "GenerateRequest",
    "Generation",
    "ReplayRequest",
    "SGLangEngine",
    "SamplingParams",
    "SamplingParamsError",
    "ScriptError",
    "ScriptedEngine",
    "TransformersEngine",
    "VLLMEngine",
    "create_engine",
    "engine_names",
    "register_engine",
]
