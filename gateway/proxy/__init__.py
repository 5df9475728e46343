"""The LLM-call proxy: OpenAI-, Anthropic- and Gemini-compatible routes guarded by CallLoopGuard."""
