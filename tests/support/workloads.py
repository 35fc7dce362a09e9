"""Small workload files the tests write."""

SMALL_LADDER = """\
data:
  type: shared_prefix
  shared_prefix: {num_groups: 3, num_prompts_per_group: 2, system_prompt_len: 64, question_len: 16, output_len: 8}
load:
  type: poisson
  stages:
    - {rate: 4, duration: 3}
    - {rate: 8, duration: 2}
"""
"""An inference-perf config of 6 prompts (3 groups x 2) in two Poisson stages (4/s for 3 s, 8/s for 2 s)."""
