"""The `loopwarden` command: `main` (the parser and `run`, `check-config`, `demo`, `proxy`,
`circuits`, `spend`), with a module for each larger subcommand: `calls`, `replay`,
`console_link`. One of the two composition roots (the demo is the other).
"""
