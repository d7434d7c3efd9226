"""What outlives a process: the turn journal, replay and audit of journals, sample files."""
