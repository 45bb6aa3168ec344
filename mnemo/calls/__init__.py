"""What mnemo does around a model call: a task's request, reply schema and re-asks (`tasks`),
and what a call may spend (`retry`)."""
