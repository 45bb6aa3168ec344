"""A step's neighbours: the steps just before and after it in its episode.

In a conversation the answer to a question often sits in the turn after the one that names
its subject ("What did you paint?" / "A lake at sunrise"), so a recall that finds one turn has
reason to look at the next one and the one before.
"""

from __future__ import annotations

from mnemo.graph.model import Node, NodeType, step_window


def adjacent_steps(node: Node, width: int = 1) -> list[str]:
    """The ids of the EPISODIC nodes up to `width` steps before and after `node` in its
    episode, nearest first; none for another type or a node without its place. A step's id
    is "<episode id>:<index>" and its node's "episodic_<step id>" (extraction.pipeline)."""
    if node.type is not NodeType.EPISODIC:
        return []
    episode, index = node.data.get("episode_id"), node.data.get("index")
    if not isinstance(episode, str) or not isinstance(index, int) or isinstance(index, bool):
        return []
    return step_window(f"episodic_{episode}:{index}", width)
