"""The plugin's scheduler for static batching (:mod:`.static`): vLLM's own scheduler, shown only
the requests a static batch admits."""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.request_queue import create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler

from . import static


class StaticBatchingScheduler(Scheduler):
    """vLLM's scheduler, shown only the requests static batching admits: while a batch runs, no
    waiting request (the batch's decodes and any preemption are vLLM's own); when the card is idle,
    the next batch (the oldest request's warmup shape, and the waiting requests that fit it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.warmup_shapes = static.shapes()

    def _next_batch(self, waiting: list) -> list:
        if self.running or not waiting:
            return []
        head = waiting[0]
        got = static.batch_limit(self.warmup_shapes, head.num_prompt_tokens, head.max_tokens)
        if got is None:        # validate_request refuses these; a request built past it waits here forever
            raise ValueError(f"vspyre static batching: request {head.request_id}: "
                             f"{static.refusal(self.warmup_shapes, head.num_prompt_tokens, head.max_tokens)}")
        shape, limit = got
        return [r for r in waiting if r.num_prompt_tokens <= shape.prompt
                and r.max_tokens <= shape.new_tokens][:limit]

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        held = list(self.waiting)
        batch = self._next_batch(held)
        chosen = {id(r) for r in batch}
        self.waiting = create_request_queue(self.policy)
        for r in batch:
            self.waiting.add_request(r)
        try:
            return super().schedule(*args, **kwargs)
        finally:
            # the batch's members not admitted (and any request vLLM preempted, which it put in
            # front), then everyone else in arrival order
            left = list(self.waiting)
            self.waiting = create_request_queue(self.policy)
            for r in left + [r for r in held if id(r) not in chosen]:
                self.waiting.add_request(r)
