"""Observability shared by every service: tracing (`telemetry`), Prometheus metrics (`metrics`, `rpc_metrics`)
and JSON logs (`logs`)."""
