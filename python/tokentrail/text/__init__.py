"""Text in and out of the model: tokenizer loading, incremental encoding, chat-template
rendering, and parsing sampled text into messages."""
