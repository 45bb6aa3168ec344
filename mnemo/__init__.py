"""mnemo: memory for LLM agents.

Sessions collect an agent's steps, extraction turns them into a per-repo knowledge graph, and
recall finds what was committed. Import everything from here: other module paths may move.
"""

from mnemo.adapters.hashing import HashEmbedder
from mnemo.adapters.offline import OfflineLLM
from mnemo.config import Config
from mnemo.episode.model import StepInfo
from mnemo.errors import (
    AdapterError,
    ConflictError,
    EmbeddingError,
    InvalidInputError,
    LLMError,
    LLMTimeout,
    MnemoError,
    NotFoundError,
    PipelineError,
    SessionError,
)
from mnemo.events import Event
from mnemo.graph.model import CommitReceipt, LinkType, Node, NodeType
from mnemo.ingest.model import IngestReceipt, Step, Trajectory
from mnemo.memory import Memory
from mnemo.memoryfiles import MemoryFile, MemoryFiles, MemoryUpdate
from mnemo.ports import LLM, Embedder, LLMRequest, LLMResponse, ToolCall, Usage
from mnemo.recall.engine import Recalled, RecallResult
from mnemo.session.machine import State
from mnemo.session.queue import OpResult
from mnemo.session.service import SessionContext

__all__ = [  # noqa: RUF022 - plain sorted(), which a test checks
    "AdapterError",
    "CommitReceipt",
    "Config",
    "ConflictError",
    "Embedder",
    "EmbeddingError",
    "Event",
    "HashEmbedder",
    "IngestReceipt",
    "InvalidInputError",
    "LLM",
    "LLMError",
    "LLMRequest",
    "LLMResponse",
    "LLMTimeout",
    "LinkType",
    "Memory",
    "MemoryFile",
    "MemoryFiles",
    "MemoryUpdate",
    "MnemoError",
    "Node",
    "NodeType",
    "NotFoundError",
    "OfflineLLM",
    "OpResult",
    "PipelineError",
    "RecallResult",
    "Recalled",
    "SessionContext",
    "SessionError",
    "State",
    "Step",
    "StepInfo",
    "ToolCall",
    "Trajectory",
    "Usage",
]
