"""A real model in process, on CPU: tiny architectures with seeded random weights
(`tiny`), the forward pass that yields logprobs and routed experts (`forward`), the images a
vision-language model's forward pass takes (`vision`), and the audit that recomputes a sample's
logprobs and routing (`audit`).

torch and transformers are imported only when a model is built or loaded.
"""
