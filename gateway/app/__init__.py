"""The running app: what a message meets between a connector and a reply.

- `runtime`: the composition the CLI starts (connectors, pipeline, HTTP server, agents);
- `stages` builds the pipeline once, `pipeline` is the onion, `middlewares/` holds one
  stage a module, each naming itself;
- `context` (TurnContext, the Agent protocol), `types` (InboundMessage, Reply…),
  `connector` (the Connector protocol), `errors` (LoopwardenError and its family),
  `messages` (every user-facing string), `refusals` (the decision log);
- `policies` (the room's effective policy, cached), `http` (the server: health,
  readiness, metrics), `jsonbody` (bounded JSON bodies), `backoff`, `eventloop`.
"""
