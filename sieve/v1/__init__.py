"""Generated gRPC stubs of the `sieve.v1` protos (run `python protos/generate.py`; do not edit)."""
