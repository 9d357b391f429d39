"""The shared evaluation harness: suites over zoo models, result records, leaderboard and plots.

- `zoo.eval.lm`: bits per character and context policies; `zoo.eval.adapter`: the text-in/text-out
  interface (`loglikelihood`, `loglikelihood_rolling`, `generate_until`).
- `zoo.eval.translation`, `speed`, `probes`, `gradients`: the measurements of the other suites.
- `zoo.eval.runner`: `zoo evaluate`; `zoo.eval.leaderboard`: `zoo leaderboard`; `zoo.eval.plots`.

Task definitions are YAML files in `evaluate/suites/`.
"""
