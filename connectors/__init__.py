"""Platform connectors: the only place platform SDKs are imported."""
