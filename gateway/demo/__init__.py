"""The embedded demo (`loopwarden demo`): `room` (the local web room and its scripted
bots, one composition root), `model` (the built-in OpenAI-compatible model) and `tools`.
"""
