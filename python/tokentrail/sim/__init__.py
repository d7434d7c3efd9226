"""Simulated harnesses and a simulated model, for tests, benchmarks and the demo; and readable
dumps of trees and samples.

Importing this package registers the simulated model as the engine `simulated`, and the same
model answering for routed experts as an SGLang MoE server would as `simulated-moe`.
"""

from __future__ import annotations

from tokentrail.sim import model as model
from tokentrail.sim import moe as moe
