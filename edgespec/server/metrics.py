"""What `GET /metrics` reports, in Prometheus' text format (prometheus-client writes it).

Counters are fed from each finished request's own stats, so they add up to what the responses'
`edgespec` fields said; latency histograms from the engine thread as tokens leave it.
"""

from __future__ import annotations

from typing import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..generate import GenerationStats
from ..speculative import RoundLog

# Draft positions counted one by one (acceptance per position, as llama-server reports it);
# deeper ones are counted in the last.
MAX_POSITIONS = 64
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("edgespec_requests", "Requests by outcome", ["outcome"], registry=r)
        self.prompt_tokens = Counter("edgespec_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.cached_tokens = Counter("edgespec_prompt_cached_tokens", "Prompt tokens found in a slot's KV cache", registry=r)
        self.shared_prefix_tokens = Counter("edgespec_prompt_shared_tokens",
                                            "Prompt tokens taken from another slot's KV or the prompt cache", registry=r)
        self.prompt_cache_saved = Counter("edgespec_prompt_cache_saves",
                                          "Slot contents saved to the prompt cache before the slot was reused", registry=r)
        self.prompt_cache_restored = Counter("edgespec_prompt_cache_restores",
                                             "Prompts taken back from the prompt cache into a slot", registry=r)
        self.generated = Counter("edgespec_generated_tokens", "Tokens generated (finished requests)", registry=r)
        self.drafted = Counter("edgespec_drafted_tokens", "Drafted tokens by drafter", ["drafter"], registry=r)
        self.accepted = Counter("edgespec_accepted_tokens", "Accepted drafted tokens by drafter", ["drafter"], registry=r)
        self.drafted_pos = Counter("edgespec_spec_decode_num_draft_tokens_per_pos",
                                   "Drafted tokens by drafter and draft position", ["drafter", "position"], registry=r)
        self.accepted_pos = Counter("edgespec_spec_decode_num_accepted_tokens_per_pos",
                                    "Accepted drafted tokens by drafter and draft position", ["drafter", "position"],
                                    registry=r)
        self.ttft = Histogram("edgespec_time_to_first_token_seconds", "From arrival to the first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.inter_token = Histogram("edgespec_inter_token_latency_seconds", "Between a request's tokens",
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self.rows_per_decode = Histogram("edgespec_rows_per_decode", "Rows in one target batch",
                                         buckets=_ROW_BUCKETS, registry=r)
        self.queue_depth = Gauge("edgespec_queue_depth", "Requests waiting for a slot", registry=r)
        self.busy_slots = Gauge("edgespec_busy_slots", "Slots generating", registry=r)

    def prompt(self, tokens: int, cached: int) -> None:
        self.prompt_tokens.inc(tokens)
        self.cached_tokens.inc(cached)

    def finished(self, outcome: str) -> None:
        self.requests.labels(outcome).inc()

    def completed(self, stats: GenerationStats, rounds: Sequence[RoundLog]) -> None:
        """A request answered in full: its tokens, and its drafting per drafter and position."""
        self.finished("completed")
        self.generated.inc(stats.tokens)
        for r in rounds:
            if not r.drafted:
                continue
            self.drafted.labels(r.source).inc(r.drafted)
            self.accepted.labels(r.source).inc(r.accepted)
            for pos in range(min(r.drafted, MAX_POSITIONS)):
                self.drafted_pos.labels(r.source, str(pos)).inc()
                if pos < r.accepted:
                    self.accepted_pos.labels(r.source, str(pos)).inc()
            if r.drafted > MAX_POSITIONS:
                last = str(MAX_POSITIONS - 1)
                self.drafted_pos.labels(r.source, last).inc(r.drafted - MAX_POSITIONS)
                self.accepted_pos.labels(r.source, last).inc(max(0, r.accepted - MAX_POSITIONS))

    def render(self) -> bytes:
        return generate_latest(self.registry)
