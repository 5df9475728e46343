"""Getting replies out: `sender` (Delivery: chunks in order, 429s retried after the
platform's wait, exactly once), `chunking` (cuts within the platform's limit) and
`streaming` (a streamed reply posted once and edited, behind the silence filter).
"""
