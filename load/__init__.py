"""Benchmarks, load generators and chaos runs; a package because the scripts import each other (and the tests
import them) as `load.<module>`, which also gives mypy one module name per file."""
