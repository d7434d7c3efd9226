"""Drop-in replacements for the agent stacks of training frameworks, built on tokentrail.

`integrations.slime`: slime's `slime.agent` adapters and `TrajectoryManager`, by one import.
"""
