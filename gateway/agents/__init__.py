"""Agents: what produces a reply for a turn (scripted, python, openai, http)."""
