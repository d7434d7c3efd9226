"""One turn around one engine call: its way through the pipeline, the caps on turns and engine
calls at once, retries answered from the record, and the reply, streamed live or written
whole."""
