"""The adapter's sessions: their lifetime, their recovery from the journal, what a recovered one
lost, and the images of kept finishes out of the heap."""
