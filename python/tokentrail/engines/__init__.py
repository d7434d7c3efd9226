"""Inference engines behind the adapter: SGLang, vLLM, and a scripted one for tests.

All speak token ids (`GenerateRequest` in, `Generation` out); `create_engine("sglang://h:p")`,
`create_engine("vllm://h:p")` or `create_engine("scripted")` picks one.
"""

from __future__ import annotations

from tokentrail.engines.base import (
    Engine,
    EngineError,
    EngineSpecError,
    GenerateRequest,
    Generation,
    SamplingParams,
    SamplingParamsError,
    create_engine,
)
from tokentrail.engines.scripted import ScriptedEngine, ScriptError
from tokentrail.engines.sglang import SGLangEngine
from tokentrail.engines.vllm import VLLMEngine

__all__ = [
    "Engine",
    "EngineError",
    "EngineSpecError",
    "GenerateRequest",
    "Generation",
    "SGLangEngine",
    "SamplingParams",
    "SamplingParamsError",
    "ScriptError",
    "ScriptedEngine",
    "VLLMEngine",
    "create_engine",
]
