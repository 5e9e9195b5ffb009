"""The planner's rules, each pure and typed: validation, sizing, placement, SSD layout, the engine
env (the backend's contract), security and topology. :mod:`hicache_operator.plan` runs them and
the builders into one plan."""
