"""Pure decision logic for loopwarden: stdlib only, no I/O, no asyncio."""
