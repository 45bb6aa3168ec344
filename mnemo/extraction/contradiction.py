"""The "contradiction" task (issue 14): does a new fact end an existing one about the same
subject ("Dana lives in Lisbon" / "Dana moved to Porto")? A commit asks it for each new fact
and the few existing facts recall finds closest to it; a fact contradicted is retired, not
deleted (`mnemo.graph.commit`)."""

from __future__ import annotations

from typing import Any

from mnemo.ports import LLMRequest, LLMResponse, preview, reply_data, task_request

CONTRADICTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"contradicts": {"type": "boolean"}},
    "required": ["contradicts"],
    "additionalProperties": False,
}
CONTRADICTION_SYSTEM = "You keep an agent's memory of facts consistent over time."
CONTRADICTION_INSTRUCTIONS = """\
An existing fact and a new fact are given. Answer true when the new fact says that the
existing one no longer holds: the same subject and relation with a different value (a new
address, a changed setting, a reversed decision, a negation). Answer false when both can
hold at once, when they are about different subjects, or when you are not sure.
Reply with JSON: {"contradicts": true|false}."""


def contradiction_request(*, existing: str, new: str) -> LLMRequest:
    """The "contradiction" task: the reply's `data` is {"contradicts": bool}."""
    return task_request(
        "contradiction",
        system=CONTRADICTION_SYSTEM,
        instructions=CONTRADICTION_INSTRUCTIONS,
        inputs={"existing": existing, "new": new},
        schema=CONTRADICTION_SCHEMA,
        max_tokens=64,
    )


def parse_contradiction(resp: LLMResponse) -> bool:
    """The answer of a "contradiction" reply.

    Raises:
        ValueError: when the reply is not an object with a boolean "contradicts".
    """
    data = reply_data(resp)
    if not isinstance(data, dict) or not isinstance(data.get("contradicts"), bool):
        raise ValueError(f"contradiction reply must be {{\"contradicts\": bool}}, got "
                         f"{preview(data)}")
    return bool(data["contradicts"])
