"""mnemo: memory for LLM agents.

Sessions collect an agent's steps, extraction turns them into a per-repo knowledge graph, and
recall finds what was committed. Import everything from here: other module paths may move.
"""

from mnemo.adapters.anthropic import Anthropic
from mnemo.adapters.e5 import E5SmallEmbedder
from mnemo.adapters.embeddings import OpenAIEmbedder
from mnemo.adapters.hashing import HashEmbedder
from mnemo.adapters.minilm import MiniLMEmbedder, default_embedder
from mnemo.adapters.offline import OfflineLLM
from mnemo.adapters.openai import OpenAICompatible
from mnemo.adapters.uri import ModelURIError, embedder_from_uri, llm_from_uri
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
from mnemo.episode.model import EpisodeLog, StepInfo
from mnemo.errors import (
    AdapterError,
    ConflictError,
    EmbeddingError,
    InvalidInputError,
    LLMError,
    LLMReplyError,
    LLMTimeout,
    MnemoError,
    NotFoundError,
    PipelineError,
    SessionError,
    StorageError,
)
from mnemo.events import Event
from mnemo.graph.history import CommitDiff, CommitRecord
from mnemo.graph.maintenance import ConsolidationReport, DecayReport, ValidationReport
from mnemo.graph.model import CommitReceipt, LinkType, Node, NodeType
from mnemo.ingest.model import IngestProgress, IngestReceipt, Step, Trajectory
from mnemo.memory import Memory
from mnemo.memoryfiles import MemoryFile, MemoryFiles, MemoryUpdate
from mnemo.ports import LLM, Embedder, LLMRequest, LLMResponse, ToolCall, Usage
from mnemo.recall.engine import Recalled, RecallResult
from mnemo.retry import Backoff, RetryPolicy
from mnemo.session.machine import State
from mnemo.session.queue import OpResult
from mnemo.session.service import SessionContext, SessionInfo

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
    "LLMError",
    "LLMReplyError",
    "LLMRequest",
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
