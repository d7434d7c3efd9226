"""tokentrail inside trainers: drop-in replacements for their agent stacks and their rollout
seams, fed by tokentrail sessions.

`integrations.slime`: slime's `slime.agent` adapters and `TrajectoryManager`, by one import;
`integrations.verl`: a verl agent loop over verl's own server manager; `integrations.trl`: a
`rollout_func` for TRL's `GRPOTrainer`.
"""
