"""Outbound requests to the outside world: where Sieve may connect (`policy`, no SSRF) and the http(s)
client that connects only there (`client`)."""
