"""The operator console at `/console` (DESIGN.md §4): sign-in, sessions, the page frame."""
