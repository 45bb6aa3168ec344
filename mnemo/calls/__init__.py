"""What mnemo does around a model call, over the plain ports of `mnemo.ports`: a task's request
and its reply read, re-asked when unusable (`tasks`), and the limiter and usage meter each call
goes through (`slots`). The retry budget and the deadlines they honour are `mnemo.calls.retry` and
`mnemo.calls.deadline`."""
