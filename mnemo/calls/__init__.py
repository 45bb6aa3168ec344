"""What mnemo does around a model call, over the plain ports of `mnemo.ports`: a task's request,
its reply's struct and schema, and asking until the reply is usable (`tasks`); what a call may
spend, its retry budget, deadlines and slot (`retry`)."""
