"""slime's agent stack on tokentrail: change one import.

    from tokentrail.integrations.slime import AnthropicAdapter, OpenAIAdapter

replaces `from slime.agent.adapters import AnthropicAdapter, OpenAIAdapter` in slime's
`examples/coding_agent_rl/generate.py`; `TrajectoryManager` and `TurnRecord` replace
`slime.agent.trajectory`'s. The modules `anthropic`, `openai` and `common` stand where slime's
`slime.agent.adapters` modules do, with the names slime's code and tests take from them
(docs/integrations/slime.md). slime itself is imported only for its `Sample` class, lazily.
"""

from tokentrail.integrations.slime.adapters import AnthropicAdapter, BaseAdapter, OpenAIAdapter
from tokentrail.integrations.slime.sample import CompatSample, sample_class
from tokentrail.integrations.slime.trajectory import TrajectoryManager, TurnRecord

__all__ = [
    "AnthropicAdapter",
    "BaseAdapter",
    "CompatSample",
    "OpenAIAdapter",
    "TrajectoryManager",
    "TurnRecord",
    "sample_class",
]
