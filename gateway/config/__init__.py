"""Configuration: one YAML file validated once at start-up (DESIGN.md §2 "Configuration").

- `schema`: the models of every section but the proxy's, and `parse_config` / `load_config`
  with `${VAR}` interpolation; `proxy`: the `proxy:` section (keys, upstreams, budgets,
  alerts); `safeyaml`: the bounded YAML loader; `limits`: the bounds every number and
  duration is held to; `urls`: URL and network fields (`public_url`, `trusted_proxies`).

Config knows nothing of the features that read it: it imports no HTTP, admin, proxy or
CLI module (the import contracts in pyproject.toml hold it to that).
"""
