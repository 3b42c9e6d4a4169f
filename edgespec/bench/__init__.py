"""Benchmark logic: prompt sets, timed baseline-vs-speculative runs, statistics, greedy verification.

No Rich, no click: the command lives in commands/bench.py, the tables in render/bench.py.
Modules: `prompts` (what runs: prompt sets, categories, modes), `stats` (a run and the figures
over runs), `results` (BenchResult, its JSON, verification), `runner` (the timed runs).

Fairness rules for the timings:
- every run starts from empty KV caches (target and draft), so no mode reuses another's prompt;
- generation tok/s excludes prompt processing: the target's prefill is outside `gen_s` already,
  and the draft model's prefill is done before the timed stream (it is added to TTFT instead);
- each run gets a fresh controller (no learning carried over between prompts or modes);
- repeats are the outer loop and the order of modes rotates per repeat, so a noisy minute hits one
  repeat of several cells (which the median drops) rather than every repeat of one mode; it also
  rotates from one prompt to the next, so within a repeat each mode runs first on some prompts and
  later on others, and a repeat's figures (of which the median is reported) mix the orders;
- every figure comes with its spread over the repeats, and a speedup whose range includes 1.0x is
  flagged: that difference is not measurable on this machine at this noise.

Verification (`--verify`) compares every greedy run with plain decoding. With exact kernels any
divergence fails. With fast kernels a batched row's logits may differ from a single row's by a
little, which flips a greedy choice only where the plain run's top two logits were nearly tied: a
divergence passes when the plain run's top-2 margin at that position is below NEAR_TIE_LOGIT.
"""
