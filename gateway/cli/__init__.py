"""The `loopwarden` command: `main` (the parser and the dispatch), one module per subcommand
(`run`, `check_config`, `demo`, `proxy`, `circuits`, `calls`, `spend`, `replay`,
`console_link`), and what they share: `command` (parser, handler, `--config`), `serving`
(the long-running ones), `shared_state` (the state a running server shares). One of the two
composition roots (the demo is the other).
"""
