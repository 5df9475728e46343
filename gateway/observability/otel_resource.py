"""The resource both OTLP exporters (traces and metrics) describe the process with.

Imported only with the `[otel]` extra, by `gateway.observability.otel` and
`gateway.observability.otel_metrics`, so the rule is written once: `service.name` is the
name the command gives (`loopwarden`, `loopwarden-proxy`) unless `OTEL_SERVICE_NAME` is
set, and `OTEL_RESOURCE_ATTRIBUTES` adds to it, as the SDK reads them.
"""

from __future__ import annotations

import os

from opentelemetry.sdk.environment_variables import OTEL_SERVICE_NAME
from opentelemetry.sdk.resources import SERVICE_NAME, Resource


def service_resource(service: str) -> Resource:
    """The SDK's resource, `service` its `service.name` unless `OTEL_SERVICE_NAME` names one.

    An attribute given to `Resource.create` wins over the variables, so `service` is
    given only when the operator named none.
    """
    attributes = {} if os.environ.get(OTEL_SERVICE_NAME) else {SERVICE_NAME: service}
    return Resource.create(attributes)
