"""Wire protocols the adapter speaks: Anthropic Messages and OpenAI Chat Completions."""
