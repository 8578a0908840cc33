"""The alert pack's families, one module each: a function of the Thresholds returning the family's
alerts, and the helpers only that family uses. gpuobs.alerts.rules assembles them (FAMILIES)."""
