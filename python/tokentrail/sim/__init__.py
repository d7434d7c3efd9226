"""Simulated harnesses and a simulated model, for tests, benchmarks and the demo; and readable
dumps of trees and samples.

Importing this package registers the simulated model as the engine `simulated`.
"""

from __future__ import annotations

from tokentrail.sim import model as model
