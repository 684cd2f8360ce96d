"""Batch jobs: a file of requests in, a file of answers out, resumable (`kev batch`, /v1/files + /v1/batches)."""
