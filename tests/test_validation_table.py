"""The echo-restore validation table, computed on the real adapter path: restore before render
trains what byte-exact echoes train; without it, or restoring too late, tokens are lost."""

from __future__ import annotations

from dataclasses import replace

from tokentrail.sim.validation import validation_table


def test_restore_before_render_matches_byte_exact_echo_and_the_others_lose(tokenizer) -> None:
    exact, no_restore, tree_only, restored = validation_table(tokenizer)
    # Rows 1 and 4 agree in every column.
    assert replace(exact, config="") == replace(restored, config="")
    assert restored.trained == restored.generated > 0
    assert restored.merges == 0 and set(restored.drifts) == {"clean"}
    assert all(trained == turns > 0 for trained, turns in restored.turns.values())
    # Without restore the rewrite merge demotes the rewritten turns.
    assert no_restore.trained < no_restore.generated
    assert no_restore.merges == 2
    assert no_restore.turns["Edit"] == (0, 1)
    # Restoring only in the tree keeps the turns but the prompt drifts from the held tokens.
    assert tree_only.merges == 0
    assert tree_only.trained < tree_only.generated
    assert tree_only.drifts.get("realign", 0) + tree_only.drifts.get("fork", 0) > 0
