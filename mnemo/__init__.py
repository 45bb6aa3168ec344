"""mnemo: memory for LLM agents. Import everything from here: other module paths may move.
Names are imported when first used (PEP 562), so a command pays only for what it needs."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # `X as X`: what a type checker sees re-exported.
    from mnemo.adapters.anthropic import Anthropic as Anthropic
    from mnemo.adapters.e5 import E5SmallEmbedder as E5SmallEmbedder
    from mnemo.adapters.embeddings import OpenAIEmbedder as OpenAIEmbedder
    from mnemo.adapters.hashing import HashEmbedder as HashEmbedder
    from mnemo.adapters.minilm import (
        MiniLMEmbedder as MiniLMEmbedder,
        default_embedder as default_embedder,
    )
    from mnemo.adapters.offline import OfflineLLM as OfflineLLM
    from mnemo.adapters.openai import OpenAICompatible as OpenAICompatible
    from mnemo.adapters.uri import (
        ModelURIError as ModelURIError,
        embedder_from_uri as embedder_from_uri,
        llm_from_uri as llm_from_uri,
    )
    from mnemo.calls.retry import Backoff as Backoff, RetryPolicy as RetryPolicy
    from mnemo.config import Config as Config
    from mnemo.conversation.manager import ConversationManager as ConversationManager
    from mnemo.conversation.model import (
        Compaction as Compaction,
        EvictionResult as EvictionResult,
        Message as Message,
        MessageView as MessageView,
        Recent as Recent,
        SearchHit as SearchHit,
        Semantic as Semantic,
        Snapshot as Snapshot,
        Summary as Summary,
        ThreadInfo as ThreadInfo,
        ToolOutputPruner as ToolOutputPruner,
        Viewport as Viewport,
    )
    from mnemo.episode import EpisodeLog as EpisodeLog, StepInfo as StepInfo
    from mnemo.errors import (
        AdapterError as AdapterError,
        ConflictError as ConflictError,
        EmbeddingError as EmbeddingError,
        EmbeddingTimeout as EmbeddingTimeout,
        InvalidInputError as InvalidInputError,
        LLMContextError as LLMContextError,
        LLMError as LLMError,
        LLMReplyError as LLMReplyError,
        LLMTimeout as LLMTimeout,
        MnemoError as MnemoError,
        NotFoundError as NotFoundError,
        PipelineError as PipelineError,
        SessionError as SessionError,
        StorageError as StorageError,
    )
    from mnemo.graph.history import CommitDiff as CommitDiff, CommitRecord as CommitRecord
    from mnemo.graph.maintenance import (
        ConsolidationReport as ConsolidationReport,
        DecayReport as DecayReport,
        ValidationReport as ValidationReport,
    )
    from mnemo.graph.model import (
        CommitReceipt as CommitReceipt,
        LinkType as LinkType,
        Node as Node,
        NodeId as NodeId,
        NodeType as NodeType,
    )
    from mnemo.graph.reembed import ReembedProgress as ReembedProgress
    from mnemo.ingest.model import (
        IngestProgress as IngestProgress,
        IngestReceipt as IngestReceipt,
        Step as Step,
        Trajectory as Trajectory,
    )
    from mnemo.memory import Memory as Memory
    from mnemo.memoryfiles import (
        MemoryFile as MemoryFile,
        MemoryFiles as MemoryFiles,
        MemoryUpdate as MemoryUpdate,
    )
    from mnemo.ports import (
        LLM as LLM,
        Embedder as Embedder,
        Event as Event,
        LLMRequest as LLMRequest,
        LLMResponse as LLMResponse,
        Reranker as Reranker,
        ToolCall as ToolCall,
        Usage as Usage,
    )
    from mnemo.recall.engine import Recalled as Recalled, RecallResult as RecallResult
    from mnemo.recall.tasks import LLMReranker as LLMReranker
    from mnemo.session.machine import (
        OpResult as OpResult,
        SessionContext as SessionContext,
        SessionInfo as SessionInfo,
        State as State,
    )

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
            "AdapterError ConflictError EmbeddingError EmbeddingTimeout InvalidInputError "
            "LLMContextError LLMError "
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

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> object:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'mnemo' has no attribute {name!r}")
    value = getattr(import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
