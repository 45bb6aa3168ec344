"""mnemo: memory for LLM agents. Import everything from here: other module paths may move.
Names are imported when first used (PEP 562), so a command pays only for what it needs."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mnemo.adapters.anthropic import Anthropic
    from mnemo.adapters.e5 import E5SmallEmbedder
    from mnemo.adapters.embeddings import OpenAIEmbedder
    from mnemo.adapters.hashing import HashEmbedder
    from mnemo.adapters.minilm import MiniLMEmbedder, default_embedder
    from mnemo.adapters.offline import OfflineLLM
    from mnemo.adapters.openai import OpenAICompatible
    from mnemo.adapters.uri import ModelURIError, embedder_from_uri, llm_from_uri
    from mnemo.calls.retry import Backoff, RetryPolicy
    from mnemo.config import Config
    from mnemo.conversation.manager import ConversationManager
    from mnemo.conversation.model import (
        Compaction,
        EvictionResult,
        Message,
        MessageView,
        Recent,
        SearchHit,
        Semantic,
        Snapshot,
        Summary,
        ThreadInfo,
        ToolOutputPruner,
        Viewport,
    )
    from mnemo.episode import EpisodeLog, StepInfo
    from mnemo.errors import (
        AdapterError,
        ConflictError,
        EmbeddingError,
        InvalidInputError,
        LLMContextError,
        LLMError,
        LLMReplyError,
        LLMTimeout,
        MnemoError,
        NotFoundError,
        PipelineError,
        SessionError,
        StorageError,
    )
    from mnemo.graph.history import CommitDiff, CommitRecord
    from mnemo.graph.maintenance import ConsolidationReport, DecayReport, ValidationReport
    from mnemo.graph.model import CommitReceipt, LinkType, Node, NodeId, NodeType
    from mnemo.graph.reembed import ReembedProgress
    from mnemo.ingest.model import IngestProgress, IngestReceipt, Step, Trajectory
    from mnemo.memory import Memory
    from mnemo.memoryfiles import MemoryFile, MemoryFiles, MemoryUpdate
    from mnemo.ports import LLM, Embedder, Event, LLMRequest, LLMResponse, Reranker, ToolCall, Usage
    from mnemo.recall.engine import Recalled, RecallResult
    from mnemo.recall.tasks import LLMReranker
    from mnemo.session.machine import OpResult, SessionContext, SessionInfo, State

# Where each public name lives.
_WHERE = {
    name: module
    for module, names in {
        "mnemo.adapters.anthropic": "Anthropic",
        "mnemo.adapters.e5": "E5SmallEmbedder",
        "mnemo.adapters.embeddings": "OpenAIEmbedder",
        "mnemo.adapters.hashing": "HashEmbedder",
        "mnemo.adapters.minilm": "MiniLMEmbedder default_embedder",
        "mnemo.adapters.offline": "OfflineLLM",
        "mnemo.adapters.openai": "OpenAICompatible",
        "mnemo.adapters.uri": "ModelURIError embedder_from_uri llm_from_uri",
        "mnemo.calls.retry": "Backoff RetryPolicy",
        "mnemo.config": "Config",
        "mnemo.conversation.manager": "ConversationManager",
        "mnemo.conversation.model": (
            "Compaction EvictionResult Message MessageView Recent SearchHit Semantic Snapshot "
            "Summary ThreadInfo ToolOutputPruner Viewport"
        ),
        "mnemo.episode": "EpisodeLog StepInfo",
        "mnemo.errors": (
            "AdapterError ConflictError EmbeddingError InvalidInputError LLMContextError LLMError "
            "LLMReplyError LLMTimeout MnemoError NotFoundError PipelineError SessionError "
            "StorageError"
        ),
        "mnemo.graph.history": "CommitDiff CommitRecord",
        "mnemo.graph.maintenance": "ConsolidationReport DecayReport ValidationReport",
        "mnemo.graph.model": "CommitReceipt LinkType Node NodeId NodeType",
        "mnemo.graph.reembed": "ReembedProgress",
        "mnemo.ingest.model": "IngestProgress IngestReceipt Step Trajectory",
        "mnemo.memory": "Memory",
        "mnemo.memoryfiles": "MemoryFile MemoryFiles MemoryUpdate",
        "mnemo.ports": "Embedder Event LLM LLMRequest LLMResponse Reranker ToolCall Usage",
        "mnemo.recall.engine": "RecallResult Recalled",
        "mnemo.recall.tasks": "LLMReranker",
        "mnemo.session.machine": "OpResult SessionContext SessionInfo State",
    }.items()
    for name in names.split()
}

__all__ = [  # noqa: RUF022 - plain sorted(), which a test checks
    "AdapterError",
    "Anthropic",
    "Backoff",
    "CommitDiff",
    "CommitReceipt",
    "CommitRecord",
    "Compaction",
    "Config",
    "ConflictError",
    "ConsolidationReport",
    "ConversationManager",
    "DecayReport",
    "E5SmallEmbedder",
    "Embedder",
    "EmbeddingError",
    "EpisodeLog",
    "Event",
    "EvictionResult",
    "HashEmbedder",
    "IngestProgress",
    "IngestReceipt",
    "InvalidInputError",
    "LLM",
    "LLMContextError",
    "LLMError",
    "LLMReplyError",
    "LLMRequest",
    "LLMReranker",
    "LLMResponse",
    "LLMTimeout",
    "LinkType",
    "Memory",
    "MemoryFile",
    "MemoryFiles",
    "MemoryUpdate",
    "Message",
    "MessageView",
    "MiniLMEmbedder",
    "MnemoError",
    "ModelURIError",
    "Node",
    "NodeId",
    "NodeType",
    "NotFoundError",
    "OfflineLLM",
    "OpResult",
    "OpenAICompatible",
    "OpenAIEmbedder",
    "PipelineError",
    "RecallResult",
    "Recalled",
    "Recent",
    "ReembedProgress",
    "Reranker",
    "RetryPolicy",
    "SearchHit",
    "Semantic",
    "SessionContext",
    "SessionError",
    "SessionInfo",
    "Snapshot",
    "State",
    "Step",
    "StepInfo",
    "StorageError",
    "Summary",
    "ThreadInfo",
    "ToolCall",
    "ToolOutputPruner",
    "Trajectory",
    "Usage",
    "ValidationReport",
    "Viewport",
    "default_embedder",
    "embedder_from_uri",
    "llm_from_uri",
]


def __getattr__(name: str) -> object:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'mnemo' has no attribute {name!r}")
    value = getattr(import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
