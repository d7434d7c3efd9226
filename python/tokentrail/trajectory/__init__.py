"""A session's turns from recording to samples: the turn pipeline, the routing tree, echo
restore, splicing, the rewrite rule, the ledger and linearization."""
