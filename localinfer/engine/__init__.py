"""The engine: continuous batching over a Runner, sampling, streaming and metrics."""

from localinfer.engine.constraint import ConstraintSource, SequenceConstraint
from localinfer.engine.embedding import (
    EmbeddingError,
    EmbeddingHandle,
    EmbeddingRequest,
    EmbeddingResult,
)
from localinfer.engine.engine import Engine, TokenizerLike
from localinfer.engine.handle import GenerationResult, RequestHandle
from localinfer.engine.types import (
    EngineMetrics,
    FinishReason,
    Request,
    RequestMetrics,
    SamplingParams,
    StepReport,
    StreamEvent,
    TokenLogprob,
)

__all__ = [
    "ConstraintSource",
    "EmbeddingError",
    "EmbeddingHandle",
    "EmbeddingRequest",
    "EmbeddingResult",
    "Engine",
    "EngineMetrics",
    "FinishReason",
    "GenerationResult",
    "Request",
    "RequestHandle",
    "RequestMetrics",
    "SamplingParams",
    "SequenceConstraint",
    "StepReport",
    "StreamEvent",
    "TokenLogprob",
    "TokenizerLike",
]
