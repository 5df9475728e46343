"""`loopwarden replay`: recorded history in, what the guards would have stopped out (DESIGN §5).

Offline and deterministic: the records' own times drive the guards, no platform, agent
or network is touched. One module per concern: `records` (what readers produce, and the
input error), `inputs` (bounded, depth-checked, streamed reading; safe zips), a reader
per format (`discord`, `slack`, `telegram`, `calls`), `detect` (which format an input
is), `engine` (the records through the gateway's own guard steps and channel rules),
`report` (the `--json` figures, the text report, the HTML page), `progress` (the bar on
a terminal) and `command` (the subcommand).
"""
