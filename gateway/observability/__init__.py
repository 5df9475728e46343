"""What operators watch: `metrics` (Prometheus), `logs` (secrets redacted), `activity`
(the live feed of decisions) and `visible` (control characters made visible in any text
shown to a person: log lines, audit entries, the terminal).
"""
