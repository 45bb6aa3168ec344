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
    "AdapterError": "mnemo.errors",
    "Anthropic": "mnemo.adapters.anthropic",
    "Backoff": "mnemo.calls.retry",
    "CommitDiff": "mnemo.graph.history",
    "CommitReceipt": "mnemo.graph.model",
    "CommitRecord": "mnemo.graph.history",
    "Compaction": "mnemo.conversation.model",
    "Config": "mnemo.config",
    "ConflictError": "mnemo.errors",
    "ConsolidationReport": "mnemo.graph.maintenance",
    "ConversationManager": "mnemo.conversation.manager",
    "DecayReport": "mnemo.graph.maintenance",
    "E5SmallEmbedder": "mnemo.adapters.e5",
    "Embedder": "mnemo.ports",
    "Reranker": "mnemo.ports",
    "LLMReranker": "mnemo.recall.tasks",
    "EmbeddingError": "mnemo.errors",
    "EpisodeLog": "mnemo.episode",
    "Event": "mnemo.ports",
    "EvictionResult": "mnemo.conversation.model",
    "HashEmbedder": "mnemo.adapters.hashing",
    "IngestProgress": "mnemo.ingest.model",
    "IngestReceipt": "mnemo.ingest.model",
    "InvalidInputError": "mnemo.errors",
    "LLM": "mnemo.ports",
    "LLMError": "mnemo.errors",
    "LLMContextError": "mnemo.errors",
    "LLMReplyError": "mnemo.errors",
    "LLMRequest": "mnemo.ports",
    "LLMResponse": "mnemo.ports",
    "LLMTimeout": "mnemo.errors",
    "LinkType": "mnemo.graph.model",
    "Memory": "mnemo.memory",
    "MemoryFile": "mnemo.memoryfiles",
    "MemoryFiles": "mnemo.memoryfiles",
    "MemoryUpdate": "mnemo.memoryfiles",
    "Message": "mnemo.conversation.model",
    "MessageView": "mnemo.conversation.model",
    "MiniLMEmbedder": "mnemo.adapters.minilm",
    "MnemoError": "mnemo.errors",
    "ModelURIError": "mnemo.adapters.uri",
    "Node": "mnemo.graph.model",
    "NodeId": "mnemo.graph.model",
    "NodeType": "mnemo.graph.model",
    "NotFoundError": "mnemo.errors",
    "OfflineLLM": "mnemo.adapters.offline",
    "OpResult": "mnemo.session.machine",
    "OpenAICompatible": "mnemo.adapters.openai",
    "OpenAIEmbedder": "mnemo.adapters.embeddings",
    "PipelineError": "mnemo.errors",
    "RecallResult": "mnemo.recall.engine",
    "Recalled": "mnemo.recall.engine",
    "Recent": "mnemo.conversation.model",
    "ReembedProgress": "mnemo.graph.reembed",
    "RetryPolicy": "mnemo.calls.retry",
    "SearchHit": "mnemo.conversation.model",
    "Semantic": "mnemo.conversation.model",
    "SessionContext": "mnemo.session.machine",
    "SessionError": "mnemo.errors",
    "SessionInfo": "mnemo.session.machine",
    "Snapshot": "mnemo.conversation.model",
    "State": "mnemo.session.machine",
    "Step": "mnemo.ingest.model",
    "StepInfo": "mnemo.episode",
    "StorageError": "mnemo.errors",
    "Summary": "mnemo.conversation.model",
    "ThreadInfo": "mnemo.conversation.model",
    "ToolCall": "mnemo.ports",
    "ToolOutputPruner": "mnemo.conversation.model",
    "Trajectory": "mnemo.ingest.model",
    "Usage": "mnemo.ports",
    "ValidationReport": "mnemo.graph.maintenance",
    "Viewport": "mnemo.conversation.model",
    "default_embedder": "mnemo.adapters.minilm",
    "embedder_from_uri": "mnemo.adapters.uri",
    "llm_from_uri": "mnemo.adapters.uri",
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
